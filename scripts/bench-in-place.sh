#!/usr/bin/env bash
# A model read in place against its packed vault (issue 34): `smoe bench
# --mode scan` (every expert once, cold, direct I/O) on the GGUF and on the
# vault `smoe pack` made of it, alternating, the page cache dropped before
# each run, the same ring and workers. Prints each run's GB/s and, per round,
# in place / vault. Not run by CI (root for drop_caches; a few GB of disk).
#
#   sudo scripts/bench-in-place.sh MODEL.gguf [VAULT_DIR]
#
# VAULT_DIR (default $WORK/vault; never beside the model) is packed from
# MODEL first when it holds no vault.
#
# Environment:
#   ROUNDS      alternating rounds (default 3)
#   WORKERS     I/O workers of both runs (default 16)
#   RING_SLOTS  ring slots of both runs (default 0: the library's choice)
#   SMOE_BIN    the smoe tool (default: built here, target/release/smoe)
#   SMOE_IN_PLACE_DIR  where the vault and the logs go (default /var/cache/smoe-in-place)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:?usage: scripts/bench-in-place.sh MODEL.gguf [VAULT_DIR]}"
WORK="${SMOE_IN_PLACE_DIR:-/var/cache/smoe-in-place}"
VAULT="${2:-$WORK/vault}"
ROUNDS="${ROUNDS:-3}"
WORKERS="${WORKERS:-16}"
RING_SLOTS="${RING_SLOTS:-0}"

say() { printf '[bench-in-place] %s\n' "$*" >&2; }
die() {
  say "error: $*"
  exit 1
}
[ "$(id -u)" -eq 0 ] || die "run as root (drop_caches)"
[ -f "$MODEL" ] || die "$MODEL is not a file"
if [ -z "${SMOE_BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release -p smoe-cli) >&2
  SMOE_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/smoe"
fi
mkdir -p "$WORK"
if [ ! -e "$VAULT/experts.smoe" ]; then
  say "packing $MODEL into $VAULT"
  "$SMOE_BIN" pack "$MODEL" "$VAULT" >&2
fi

# scan PATH: one cold scan, prints its seconds and the bytes it read
scan() {
  sync
  echo 3 >/proc/sys/vm/drop_caches
  "$SMOE_BIN" bench "$1" --mode scan --workers "$WORKERS" --ring-slots "$RING_SLOTS" --json 2>/dev/null |
    sed -n 's/.*"bytes_read":\([0-9]*\).*"seconds":\([0-9.]*\).*/\2 \1/p'
}

# The ratio is of times (the same experts, vault time / in-place time): a
# model's bytes_read counts the whole 4 KiB windows around each slice, so
# its GB/s would flatter it by its over-read.
say "model $MODEL ($(stat -c %s "$MODEL") bytes), vault $VAULT, $ROUNDS rounds, $WORKERS workers"
ratios=()
for r in $(seq 1 "$ROUNDS"); do
  read -r a a_bytes <<<"$(scan "$MODEL")"
  read -r b b_bytes <<<"$(scan "$VAULT")"
  ratio="$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }')"
  ratios+=("$ratio")
  awk -v r="$r" -v a="$a" -v b="$b" -v items="$b_bytes" -v ab="$a_bytes" -v q="$ratio" 'BEGIN {
    printf "round %d: in place %.2f s (%.2f GB/s of experts, %.2f%% more bytes read), vault %.2f s (%.2f GB/s), in place / vault speed %s\n",
      r, a, items / a / 1e9, (ab / items - 1) * 100, b, items / b / 1e9, q }'
done
printf 'in place / vault speed per round: %s\n' "${ratios[*]}"
