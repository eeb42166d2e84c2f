#!/usr/bin/env bash
# Benchmark of `smoe pack` against `cp` of the same file.
#
#   sudo scripts/bench-pack.sh            # root: drops the page cache before each side
#
# It writes (once, cached in $SMOE_BENCH_DIR, default /var/tmp/smoe-bench-pack)
# a GGUF of 8 layers x 32 experts, n_embd 2048, n_ff 768, Q8_0 stacked
# experts (about 1.28 GB), with the `gguf` Python package (installed into a
# venv there if missing: numpy and gguf only). Then, ROUNDS times (default 2),
# alternating: drop caches, `cp` the file; drop caches, `smoe pack` it. It
# prints each run's seconds, the throughput ratio pack/cp and pack's peak RSS
# (GNU time's maximum resident set size).
#
# Environment: SMOE_BIN (default target/release/smoe, built if missing),
# SMOE_BENCH_DIR, ROUNDS, PYTHON (default python3).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
DIR=${SMOE_BENCH_DIR:-/var/tmp/smoe-bench-pack}
ROUNDS=${ROUNDS:-2}
PYTHON=${PYTHON:-python3}
SMOE_BIN=${SMOE_BIN:-$ROOT/target/release/smoe}
MODEL=$DIR/bench-q8_0.gguf
mkdir -p "$DIR"

if [ ! -x "$SMOE_BIN" ]; then
  cargo build --release
fi
if [ ! -x /usr/bin/time ]; then
  echo "needs GNU time (/usr/bin/time): apt-get install time" >&2
  exit 1
fi

if [ ! -f "$MODEL" ]; then
  if [ ! -x "$DIR/venv/bin/python" ]; then
    "$PYTHON" -m venv "$DIR/venv"
    "$DIR/venv/bin/pip" install -q numpy gguf
  fi
  echo "writing $MODEL with the gguf package ..."
  "$DIR/venv/bin/python" - "$MODEL" <<'PY'
import sys
import numpy as np
import gguf

path = sys.argv[1]
n_layer, n_expert, n_embd, n_ff = 8, 32, 2048, 768
rng = np.random.default_rng(7)
w = gguf.GGUFWriter(path, "qwen3moe")
w.add_block_count(n_layer)
w.add_expert_count(n_expert)
w.add_expert_used_count(8)
w.add_embedding_length(n_embd)

def q8_0(rows, cols, experts):
    # Valid Q8_0 blocks: an f16 scale, then 32 int8 values; random bytes
    # for the values, a small positive scale.
    blocks = experts * rows * (cols // 32)
    b = rng.integers(0, 256, size=(blocks, 34), dtype=np.uint8)
    b[:, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    return b.reshape(experts, rows, cols // 32 * 34)

for l in range(n_layer):
    for name, rows, cols in (("gate", n_ff, n_embd), ("up", n_ff, n_embd), ("down", n_embd, n_ff)):
        # uint8 bytes shaped (experts, rows, bytes per row): the writer
        # derives the element shape from the Q8_0 block size.
        w.add_tensor(f"blk.{l}.ffn_{name}_exps.weight", q8_0(rows, cols, n_expert),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor(f"blk.{l}.ffn_gate_inp.weight", rng.standard_normal((n_expert, n_embd), dtype=np.float32))
    w.add_tensor(f"blk.{l}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
w.add_tensor("token_embd.weight", rng.standard_normal((1024, n_embd), dtype=np.float32))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
PY
fi

drop_caches() {
  sync
  if [ -w /proc/sys/vm/drop_caches ]; then
    echo 3 >/proc/sys/vm/drop_caches
    echo "cold"
  else
    echo "warm (not root: page cache not dropped)"
  fi
}

BYTES=$(stat -c %s "$MODEL")
echo "model: $MODEL, $BYTES bytes"
for round in $(seq 1 "$ROUNDS"); do
  rm -rf "$DIR/copy.gguf" "$DIR/vault"
  state=$(drop_caches)
  start=$(date +%s.%N)
  cp "$MODEL" "$DIR/copy.gguf"
  sync
  cp_s=$(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN { print a - b }')
  rm -f "$DIR/copy.gguf"
  state=$(drop_caches)
  start=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$DIR/rss" "$SMOE_BIN" pack "$MODEL" "$DIR/vault" >"$DIR/pack.out"
  sync
  pack_s=$(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN { print a - b }')
  rss_kib=$(tail -n 1 "$DIR/rss")
  awk -v r="$round" -v st="$state" -v c="$cp_s" -v p="$pack_s" -v n="$BYTES" -v rss="$rss_kib" 'BEGIN {
    printf "round %d (%s): cp %.2f s (%.2f GB/s), pack %.2f s (%.2f GB/s), pack/cp throughput %.2f, pack peak RSS %d MiB\n",
      r, st, c, n / c / 1e9, p, n / p / 1e9, c / p, rss / 1024 }'
done
echo
cat "$DIR/pack.out"
rm -rf "$DIR/vault"
