#!/usr/bin/env bash
# Stock llama.cpp (mmap) against llama.cpp + smoe on a model bigger than the
# memory it may use: a random-weight Qwen3-MoE of about 3 GB (Q8_0), both runs
# in a cgroup v2 limited to 1.5 GiB, page cache dropped before each, greedy
# 64 tokens. Prints tokens/s, time to first token and bytes read for both and
# checks the generated text is identical. Not run by CI (root, ~10 GB of disk,
# tens of minutes the first time). Results: docs/performance.md.
#
#   sudo scripts/llama-capped.sh
#
# Environment:
#   SMOE_CAPPED_DIR   work directory (default /var/cache/smoe-llama-capped):
#                     the safetensors (~5.5 GB, deleted after conversion), the
#                     GGUF (~3 GB), its vault (~3 GB), logs
#   SMOE_FIXTURE_VENV the Python environment of scripts/make-model-fixtures.sh
#                     (torch, transformers, sentencepiece, gguf), made by it
#   CAP               memory.max of the cgroup (default 1536M)
#   N_PREDICT         tokens to generate (default 64)
#   SMOE_RING_SLOTS   ring slots for the smoe run (default 448: 1.05 GiB of
#                     2.39 MiB experts, leaving room for the rest under the cap)
#   THREADS           llama-simple -t (default: nproc)
#   SKIP_STOCK=1      keep the stock run of an earlier call (another ring size)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${SMOE_CAPPED_DIR:-/var/cache/smoe-llama-capped}"
VENV="${SMOE_FIXTURE_VENV:-/var/cache/smoe-fixtures-venv}"
CAP="${CAP:-1536M}"
N_PREDICT="${N_PREDICT:-64}"
SLOTS="${SMOE_RING_SLOTS:-448}"
THREADS="${THREADS:-$(nproc)}"
PROMPT="Hello world"

say() { printf '[llama-capped] %s\n' "$*" >&2; }
die() {
  say "error: $*"
  exit 1
}

[ "$(id -u)" -eq 0 ] || die "run as root (cgroup, drop_caches)"
# the memory cgroup: v2 (/sys/fs/cgroup/NAME, memory.max), else v1 under this
# process's own memory cgroup (memory.limit_in_bytes)
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  grep -qw memory /sys/fs/cgroup/cgroup.controllers || die "the cgroup v2 memory controller is not available"
  CG=/sys/fs/cgroup/smoe-llama-capped
  CG_KIND="cgroup v2"
elif [ -d /sys/fs/cgroup/memory ]; then
  CG="/sys/fs/cgroup/memory$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)"
  CG="${CG%/}/smoe-llama-capped"
  CG_KIND="cgroup v1"
else
  die "no memory cgroup (v2 at /sys/fs/cgroup, or v1 at /sys/fs/cgroup/memory)"
fi
[ -x "$VENV/bin/python" ] || die "no $VENV: run scripts/make-model-fixtures.sh first (it makes the venv)"

BIN="$("$ROOT/scripts/llama.sh" build)"
LLAMA_SRC="$(dirname "$(dirname "$(dirname "$BIN")")")/llama.cpp"
(cd "$ROOT" && cargo build --release -p smoe-cli) >&2
SMOE="${CARGO_TARGET_DIR:-$ROOT/target}/release/smoe"
mkdir -p "$WORK"
GGUF="$WORK/qwen3moe-capped-q8_0.gguf"
VAULT="$WORK/vault"

# 1. the model: transformers from a config (24 layers x 48 experts, top-8,
#    hidden 1024, expert FFN 768), random weights (seeded), bf16 safetensors,
#    then llama.cpp's convert_hf_to_gguf.py --outtype q8_0 (through the fixture
#    script's wrapper, which gives Qwen3-MoE the sentencepiece vocabulary)
if [ ! -f "$GGUF" ]; then
  HF="$WORK/hf"
  rm -rf "$HF"
  say "writing a random Qwen3-MoE with transformers into $HF"
  "$VENV/bin/python" - "$HF" "$ROOT/tests/fixtures/models/tokenizer.model" <<'EOF'
import shutil, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM
out, tok = sys.argv[1], sys.argv[2]
cfg = AutoConfig.for_model(
    "qwen3_moe", vocab_size=384, bos_token_id=1, eos_token_id=2, pad_token_id=None,
    max_position_embeddings=4096, tie_word_embeddings=False,
    hidden_size=1024, intermediate_size=3072, moe_intermediate_size=768,
    num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
    num_experts=48, num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[],
    norm_topk_prob=True)
torch.manual_seed(20240610)
torch.set_default_dtype(torch.bfloat16)  # 2.8 B parameters: never in float32
model = AutoModelForCausalLM.from_config(cfg)
model = model.to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True, max_shard_size="2GB")
shutil.copy(tok, out + "/tokenizer.model")
print("parameters:", sum(p.numel() for p in model.parameters()))
EOF
  say "converting to Q8_0 GGUF"
  "$VENV/bin/python" "$ROOT/scripts/make-model-fixtures.py" _convert "$LLAMA_SRC" \
    --outtype q8_0 --outfile "$GGUF.tmp" "$HF" >"$WORK/convert.log" 2>&1 ||
    { tail -20 "$WORK/convert.log" >&2; die "convert_hf_to_gguf failed (log: $WORK/convert.log)"; }
  mv "$GGUF.tmp" "$GGUF"
  rm -rf "$HF"
fi
say "model: $GGUF ($(du -h "$GGUF" | cut -f1))"

# 2. its vault
if [ ! -f "$VAULT/experts.smoe" ]; then
  say "packing $VAULT"
  "$SMOE" pack "$GGUF" "$VAULT" --force >&2
fi
rm -f "$VAULT/expert_freq.bin"  # no histogram from an earlier run: no pre-warm

# 3. the runs, each in the capped cgroup with a cold page cache
mkdir -p "$CG"
trap 'rmdir "$CG" 2>/dev/null || true' EXIT # empty again once each run has exited
CAP_BYTES=$(numfmt --from=iec "$CAP")
if [ "$CG_KIND" = "cgroup v2" ]; then
  echo "+memory" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
  echo "$CAP_BYTES" >"$CG/memory.max"
  echo 0 >"$CG/memory.swap.max" 2>/dev/null || true
  PEAK_FILE="$CG/memory.peak"
else
  echo "$CAP_BYTES" >"$CG/memory.limit_in_bytes"
  PEAK_FILE="$CG/memory.max_usage_in_bytes"
fi

# run NAME ENV...: llama-simple in the cgroup with a cold page cache; prints
# its figures. Bytes read: read_bytes of /proc/PID/io (storage reads the
# process caused, page faults included), sampled until it exits.
run() {
  local name=$1
  shift
  local out="$WORK/$name.out" err="$WORK/$name.err" io="$WORK/$name.io"
  rm -f "$io"
  sync
  echo 3 >/proc/sys/vm/drop_caches
  [ "$CG_KIND" = "cgroup v2" ] || echo 0 >"$PEAK_FILE" # v1: reset the peak
  local t0 t1
  t0=$(date +%s.%N)
  # the shell joins the cgroup, then starts llama-simple (which inherits it)
  bash -c 'echo $$ >"$1/cgroup.procs"; io=$2; shift 2; "$@" & pid=$!
           while kill -0 $pid 2>/dev/null; do cat /proc/$pid/io >"$io.tmp" 2>/dev/null && mv "$io.tmp" "$io"; sleep 0.1; done
           wait $pid' _ "$CG" "$io" env "$@" "$BIN" -t "$THREADS" -m "$GGUF" -n "$N_PREDICT" "$PROMPT" >"$out" 2>"$err" ||
    { tail -20 "$err" >&2; die "$name failed (log: $err)"; }
  t1=$(date +%s.%N)
  local peak read_bytes
  peak=$(cat "$PEAK_FILE" 2>/dev/null || echo 0)
  read_bytes=$(awk '/^read_bytes/ {print $2}' "$io" 2>/dev/null || echo 0)
  # llama_perf_context_print's lines: "load time = X ms", "prompt eval time = X ms / N tokens",
  # "eval time = X ms / N runs"
  awk -v name="$name" -v t0="$t0" -v t1="$t1" -v rb="${read_bytes:-0}" -v peak="$peak" '
    function num(s) { gsub(/[^0-9.]/, "", s); return s + 0 }
    /load time =/        { split($0, a, "="); load = num(a[2]) }
    /prompt eval time =/ { split($0, a, "="); split(a[2], b, "/"); pe = num(b[1]) }
    /[^t] eval time =/   { split($0, a, "="); split(a[2], b, "/"); ev = num(b[1]); split(b[2], c, " "); n = c[1] + 0 }
    END {
      printf "%-6s %6.2f tokens/s (%d tokens after the first in %.2f s), time to first token %.2f s (load %.2f + prompt %.2f), read %.2f GiB, wall %.1f s, peak %.2f GiB\n",
        name, (ev > 0 ? n / (ev / 1000) : 0), n, ev / 1000, (load + pe) / 1000, load / 1000, pe / 1000,
        rb / 1073741824, t1 - t0, peak / 1073741824
    }' "$err"
  grep '^smoe: claims' "$err" || true
}

if [ "${SKIP_STOCK:-0}" != 1 ] || [ ! -f "$WORK/stock.out" ]; then
  say "stock llama.cpp (mmap), $CG_KIND memory limit $CAP"
  run stock
fi
say "llama.cpp + smoe ($SLOTS slots), $CG_KIND memory limit $CAP"
run smoe SMOE_VAULT="$VAULT" SMOE_RING_SLOTS="$SLOTS"

if cmp -s "$WORK/stock.out" "$WORK/smoe.out"; then
  echo "tokens: identical ($(wc -c <"$WORK/stock.out") bytes of text)"
else
  echo "tokens: DIFFER"
  diff <(fold -w 80 "$WORK/stock.out") <(fold -w 80 "$WORK/smoe.out") | head -10
  exit 1
fi
