#!/usr/bin/env bash
# llama.cpp's CUDA build with smoe against stock llama.cpp CUDA with
# --cpu-moe (issue 25 item 3; docs/llama.md "CUDA"). Run after
# `scripts/llama.sh build --cuda`; `scripts/cuda.sh llama` runs both.
#
# Two models: the committed fixture qwen3moe-q8_0.gguf, and a random
# Qwen3-MoE made by test-support/examples/broad_model.rs (LAYERS x EXPERTS, top-8,
# hidden 1024, expert FFN 768, Q8_0). For each, greedy decoding with
# llama-completion, -ngl 99 (every layer on the GPU) of a short prompt and
# of one of more than 32 tokens (for which stock llama.cpp copies the
# experts' weights to the GPU, "op offload"): stock with --cpu-moe (the
# experts in host memory), stock with --cpu-moe --no-op-offload, and smoe
# with SMOE_VAULT (the experts from the ring; smoe turns op offload off).
# smoe's text must equal stock's without op offload (the same kernels), and
# is compared with stock's with it. Then llama-bench, prefill and decode
# tokens/s, the three ways; and, as root with cgroup v2, the short prompt
# again in a memory cgroup capped below the model's size.
#
# Environment: SMOE_LLAMA_DIR (default /var/cache/smoe-llama), SMOE_BIN (the
# smoe tool; default target/release/smoe), BROAD_BIN (the model generator;
# default: built with cargo), WORK (default target/llama-cuda),
# N_PREDICT (default 32), LAYERS (12), EXPERTS (32), CAP_MIB (the cap;
# default 60% of the random model's size).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${SMOE_LLAMA_DIR:-/var/cache/smoe-llama}"
BIN="$DIR/build-cuda/bin"
SMOE_BIN="${SMOE_BIN:-$ROOT/target/release/smoe}"
WORK="${WORK:-$ROOT/target/llama-cuda}"
N_PREDICT="${N_PREDICT:-32}"
LAYERS="${LAYERS:-12}"
EXPERTS="${EXPERTS:-32}"

say() { printf '[llama-cuda.sh] %s\n' "$*" >&2; }
die() {
  say "error: $*"
  exit 1
}

for t in llama-completion llama-bench; do
  [ -x "$BIN/$t" ] || die "$BIN/$t is not built: run scripts/llama.sh build --cuda"
done
[ -x "$SMOE_BIN" ] || die "no smoe tool at $SMOE_BIN (set SMOE_BIN)"
mkdir -p "$WORK"

SHORT="Hello world"
LONG="The quick brown fox jumps over the lazy dog while the farmer counts his sheep in the early morning light, and the river runs past the old mill towards the sea."

broad="$WORK/broad-${LAYERS}x${EXPERTS}.gguf"
if [ ! -f "$broad" ]; then
  if [ -z "${BROAD_BIN:-}" ]; then
    (cd "$ROOT" && cargo build --release -p smoe-test-support --example broad_model) >&2 ||
      die "cannot build the model generator (set BROAD_BIN to a built one)"
    BROAD_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/broad_model"
  fi
  say "making $broad (test-support/examples/broad_model.rs)"
  "$BROAD_BIN" "$broad" --layers "$LAYERS" --experts "$EXPERTS" \
    --vocab "$ROOT/tests/fixtures/models/qwen3moe-q8_0.gguf" >&2 || die "$BROAD_BIN failed"
fi

# The two timing lines of llama's perf print in LOG, on one line.
pp_tg() {
  grep -E 'prompt eval time|[^t] eval time' "$1" | sed 's/^.*_perf_print: *//' | tr -s ' ' | paste -sd ';' -
}

# complete OUT PREFIX...: llama-completion (PREFIX: env assignments and the
# binary's path first), its text in OUT.txt and its log in OUT.log.
complete() {
  local out=$1
  shift
  "$@" </dev/null >"$out.txt" 2>"$out.log" || {
    say "failed: $* ($(grep -m 1 -E 'error|ASSERT|failed' "$out.log" || tail -n 1 "$out.log"))"
    return 1
  }
}

same() { cmp -s "$1.txt" "$2.txt" && [ -s "$1.txt" ] && echo "identical ($(wc -c <"$1.txt") bytes)" || echo DIFFERENT; }

status=0
for model in "$ROOT/tests/fixtures/models/qwen3moe-q8_0.gguf" "$broad"; do
  name="$(basename "$model" .gguf)"
  vault="$WORK/$name.vault"
  [ -f "$vault/experts.smoe" ] || "$SMOE_BIN" pack --force "$model" "$vault" >/dev/null
  for which in short long; do
    prompt="$SHORT"
    [ "$which" = long ] && prompt="$LONG"
    common=(-m "$model" -ngl 99 -n "$N_PREDICT" --temp 0 --seed 1 -no-cnv -p "$prompt")
    o="$WORK/$name.$which"
    complete "$o.stock" "$BIN/llama-completion" "${common[@]}" --cpu-moe || status=1
    complete "$o.stock-nopo" "$BIN/llama-completion" "${common[@]}" --cpu-moe --no-op-offload || status=1
    complete "$o.smoe" env SMOE_VAULT="$vault" "$BIN/llama-completion" "${common[@]}" || status=1
    v="$(same "$o.smoe" "$o.stock-nopo")"
    [ "$v" = DIFFERENT ] && status=1
    echo "llama: $name, $which prompt, -ngl 99: smoe vs stock --cpu-moe --no-op-offload: $v; vs stock --cpu-moe: $(same "$o.smoe" "$o.stock")"
    echo "llama:   stock --cpu-moe:                 $(pp_tg "$o.stock.log")"
    echo "llama:   stock --cpu-moe --no-op-offload: $(pp_tg "$o.stock-nopo.log")"
    echo "llama:   smoe SMOE_VAULT:                 $(pp_tg "$o.smoe.log")"
    grep -h '^smoe: claims' "$o.smoe.log" | sed 's/^/llama:   /' || true
  done
  for run in "stock --n-cpu-moe 99::-ncmoe 99" "stock --n-cpu-moe 99 --no-op-offload::-ncmoe 99 -nopo 1" \
    "smoe SMOE_VAULT:SMOE_VAULT=$vault:"; do
    label="${run%%:*}"
    rest="${run#*:}"
    envs="${rest%%:*}"
    opts="${rest#*:}"
    echo "llama: $name, llama-bench -ngl 99 -p 512 -n 64 -r 2, $label:"
    # shellcheck disable=SC2086 # opts and envs are word lists
    env $envs "$BIN/llama-bench" -m "$model" -ngl 99 $opts -p 512 -n 64 -r 2 -o md 2>"$WORK/$name.bench.log" |
      grep -E '^\| qwen' || { say "llama-bench failed: $(tail -n 2 "$WORK/$name.bench.log")"; status=1; }
  done
done

# Capped: the short prompt on the random model in a memory cgroup of
# CAP_MIB (one cgroup a run, so that each peak is its own), the page cache
# dropped first.
if [ "$(id -u)" -eq 0 ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
  model_mib=$(($(stat -c %s "$broad") >> 20))
  cap="${CAP_MIB:-$((model_mib * 6 / 10))}"
  grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory >/sys/fs/cgroup/cgroup.subtree_control
  common=(-m "$broad" -ngl 99 -n "$N_PREDICT" --temp 0 --seed 1 -no-cnv -p "$SHORT")
  o="$WORK/capped"
  for run in stock smoe smoe-fixed; do
    cg="/sys/fs/cgroup/smoe-llama-cuda.$$.$run"
    mkdir "$cg"
    echo $((cap << 20)) >"$cg/memory.max"
    echo 0 >"$cg/memory.swap.max" 2>/dev/null || true
    sync
    echo 3 >/proc/sys/vm/drop_caches
    if [ "$run" = stock ]; then
      args=("$BIN/llama-completion" "${common[@]}" --cpu-moe)
    elif [ "$run" = smoe ]; then
      args=(env SMOE_VAULT="$WORK/broad-${LAYERS}x${EXPERTS}.vault" "$BIN/llama-completion" "${common[@]}")
    else
      # a fixed ring of a third of the cap
      args=(env SMOE_VAULT="$WORK/broad-${LAYERS}x${EXPERTS}.vault" SMOE_ELASTIC=0
        SMOE_RING_SLOTS=$(((cap << 20) / 3 * LAYERS * EXPERTS / $(stat -c %s "$WORK/broad-${LAYERS}x${EXPERTS}.vault/experts.smoe")))
        "$BIN/llama-completion" "${common[@]}")
    fi
    start=$(date +%s%N)
    complete "$o.$run" bash -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' _ "$cg" "${args[@]}" || status=1
    wall=$((($(date +%s%N) - start) / 1000000))
    echo "llama: capped at $cap MiB (model $model_mib MiB), $run: $(pp_tg "$o.$run.log"); wall $wall ms, peak $(($(cat "$cg/memory.peak" 2>/dev/null || echo 0) >> 20)) MiB"
    grep -h '^smoe: claims' "$o.$run.log" | sed 's/^/llama:   /' || true
    rmdir "$cg" 2>/dev/null || true
  done
  echo "llama: capped, smoe vs stock --cpu-moe: $(same "$o.smoe" "$o.stock"); fixed ring: $(same "$o.smoe-fixed" "$o.stock"); smoe capped vs uncapped: $(same "$o.smoe" "$WORK/broad-${LAYERS}x${EXPERTS}.short.smoe")"
else
  say "skipping the capped run: it needs root and cgroup v2's memory controller"
fi
exit $status
