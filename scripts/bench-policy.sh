#!/usr/bin/env bash
# Hit rates of the eviction policies, measured by replaying routing traces
# through the streamer (demand only), against the exact LRU and Belady
# simulations of `smoe bench --trace`: the table in docs/performance.md.
#
#   scripts/bench-policy.sh [MIXTRAL_TRACE.csv]
#
# - the synthetic router (48 layers × 128 experts, top-8, keep 0.45, 200
#   tokens), captured once with `smoe bench --capture`, at 5, 10, 25 and 50%
#   of the experts;
# - with a trace argument, that trace (32 layers × 8 experts, top-2: the
#   Mixtral-8x7B decode trace the docs use, not shipped) at 25, 64, 100 and
#   128 slots.
#
# Prints one markdown row per (trace, ring): LRU and adaptive as measured,
# Belady simulated, and the share of LRU's gap to Belady the adaptive policy
# closes. Needs no root; about a minute on 2 cores. SMOE_POLICY_DIR (default
# target/bench-policy) holds the vaults.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${SMOE_POLICY_DIR:-$ROOT/target/bench-policy}"
SMOE="$ROOT/target/release/smoe"
(cd "$ROOT" && cargo build --release -q -p smoe-cli)
mkdir -p "$WORK"

row() { # name vault trace top_k slots
  local lru ada
  lru=$("$SMOE" bench "$2" --trace "$3" --top-k "$4" --ring-slots "$5" --policy lru --json)
  ada=$("$SMOE" bench "$2" --trace "$3" --top-k "$4" --ring-slots "$5" --policy adaptive --json)
  python3 - "$1" "$5" "$lru" "$ada" <<'EOF'
import json, sys
name, slots, lru, ada = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
l, a, b = lru["coverage"] * 100, ada["coverage"] * 100, lru["sim"]["belady"] * 100
gap = b - l
closed = f"{(a - l) / gap * 100:.0f}%" if gap > 0 else "-"
print(f"| {name} | {slots} | {l:.1f}% | {a:.1f}% | {b:.1f}% | {closed} |")
EOF
}

echo "| trace | ring slots | LRU | adaptive | Belady | gap closed |"
echo "| --- | --- | --- | --- | --- | --- |"
ROUTER_VAULT="$WORK/router-vault"
ROUTER_TRACE="$WORK/router.csv"
if [ ! -f "$ROUTER_VAULT/experts.smoe" ]; then
  "$SMOE" synth "$ROUTER_VAULT" --layers 48 --experts 128 --blob-kib 16 >/dev/null
fi
if [ ! -f "$ROUTER_TRACE" ]; then
  "$SMOE" bench "$ROUTER_VAULT" --tokens 200 --top-k 8 --ring-slots 6144 \
    --capture "$ROUTER_TRACE" --json >/dev/null
fi
for n in 307 614 1536 3072; do
  row "router 48×128 top-8" "$ROUTER_VAULT" "$ROUTER_TRACE" 8 "$n"
done
if [ $# -ge 1 ]; then
  MIX_VAULT="$WORK/mixtral-vault"
  if [ ! -f "$MIX_VAULT/experts.smoe" ]; then
    "$SMOE" synth "$MIX_VAULT" --layers 32 --experts 8 --blob-kib 64 >/dev/null
  fi
  for n in 25 64 100 128; do
    row "Mixtral decode" "$MIX_VAULT" "$1" 2 "$n"
  done
fi
