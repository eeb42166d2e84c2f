#!/usr/bin/env bash
# The capped comparison (docs/performance.md, "smoe against mmap, under a
# memory cap"): smoe against mmap on the same trace under the same memory
# cap, next to exact LRU and Belady.
#
#   scripts/bench-capped.sh [DIR]      (root: memory cgroups, drop_caches)
#
# - the first TOKENS (default 150) tokens of the shared Mixtral trace
#   (../shared/traces/mixtral-8x7b-decode.csv, never copied here; TRACE=...
#   names another);
# - a 3 GB Mixtral-shaped vault, 32 layers × 8 experts of 12 MiB, written once
#   under DIR (default target/bench-capped);
# - a 100-slot ring, top-2, each side in its own memory cgroup capped at
#   MEM_CAP (default 1610612736 = 1.5 GiB), page cache dropped before each;
# - prints the text report and the JSON, writes the plot to DIR/capped.svg.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
DIR=${1:-target/bench-capped}
TRACE=${TRACE:-../shared/traces/mixtral-8x7b-decode.csv}
TOKENS=${TOKENS:-150}
MEM_CAP=${MEM_CAP:-1610612736}
RING=${RING:-100}

if [ "$(id -u)" -ne 0 ]; then
  echo "needs root: memory cgroups and dropping the page cache" >&2
  exit 1
fi
if [ ! -f "$TRACE" ]; then
  echo "no trace at $TRACE (set TRACE=...)" >&2
  exit 1
fi

cargo build --release --quiet -p smoe-cli
SMOE=target/release/smoe
mkdir -p "$DIR"
VAULT="$DIR/mixtral-shaped-3g"
if [ ! -f "$VAULT/experts.smoe" ]; then
  "$SMOE" synth "$VAULT" --layers 32 --experts 8 --blob-kib 12288 >/dev/null
fi

set -x
"$SMOE" bench "$VAULT" --trace "$TRACE" --top-k 2 --max-tokens "$TOKENS" \
  --ring-slots "$RING" --mem-cap "$MEM_CAP" --baseline mmap --plot "$DIR/capped.svg"
"$SMOE" bench "$VAULT" --trace "$TRACE" --top-k 2 --max-tokens "$TOKENS" --sweep --ring-slots "$RING"
