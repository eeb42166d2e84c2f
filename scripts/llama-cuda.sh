#!/usr/bin/env bash
# llama.cpp's CUDA build with smoe against stock llama.cpp CUDA with
# --cpu-moe (issue 37; docs/llama.md "CUDA"). Run after
# `scripts/llama.sh build --cuda`; `scripts/cuda.sh llama` runs both.
#
# With -ngl 99 every layer is on the GPU but the routed experts: stock keeps
# them in host memory (--cpu-moe, the page cache of its mmap), smoe streams
# them through its ring (SMOE=1, the GGUF read in place). A batch of 32
# tokens or more computes its experts on the GPU ("op offload"): stock copies
# the experts the batch uses from its mmap, smoe those it claimed from their
# ring slots. Decode computes them on the CPU, both ways.
#
# Two models: the committed fixture qwen3moe-q8_0.gguf, and a broad-routing
# random Qwen3-MoE made by test-support/examples/broad_model.rs (LAYERS x
# EXPERTS, top-8, hidden 1024, expert FFN 768, Q8_0; 24 x 64 = 3.9 GB).
#
# 1. Text: greedy llama-completion of a short prompt and of one over 32
#    tokens, smoe against stock --cpu-moe (op offload on both), and with op
#    offload off on both (--no-op-offload, SMOE_OP_OFFLOAD=0): identical, or
#    the script fails.
# 2. Uncapped (the model in the page cache): llama-bench -p 512 -n 64,
#    alternating, ROUNDS rounds: prefill and decode tokens/s, smoe / stock.
# 3. Capped: as root with cgroup v2, a prompt of about 2,000 tokens (the long
#    one 19 times) and N_CAPPED tokens in a memory cgroup of CAP_MIB
#    (default: the model's size / 2.5), page cache dropped, CAPPED_ROUNDS
#    rounds: prefill and decode tokens/s, smoe / stock. Stock runs its
#    default n_ubatch of 512 (four passes over the experts, each read from
#    the drive again); smoe raises it to n_batch (one pass), so its text is
#    compared with stock's at that n_ubatch (uncapped).
# smoe's runs print the bytes of experts copied to the GPU per prompt token.
# Each uncapped round also runs smoe with SMOE_COPY_AHEAD=0 (each weight's
# experts copied in order, on the compute stream, as stock does), and prints
# the time per 512-token prompt that copying ahead saved; with SMOE_CUDA_BIN
# (examples-cuda's smoe-cuda, which scripts/cuda.sh builds) it measures the
# pinned copy rate and says what share of the copies' time that was.
#
# `scripts/llama-cuda.sh tier` runs issue 50's table instead (docs/llama.md "Device
# tier"): for the broad model and one routed like the Mixtral trace (--move 0.3;
# docs/llama.md "Routing"), decode tokens/s of stock --cpu-moe, smoe without the
# tier, smoe with a tier of TIER_SHARE percent of the experts (SMOE_VRAM), and stock
# with every expert on the GPU (the limit), alternating, ROUNDS rounds, llama-bench
# -p 16 -n TIER_N; the tier's hit rate; the text of smoe with the tier against stock
# --cpu-moe; then, as root with cgroup v2, smoe without and with the tier in a memory
# cgroup of the model's size / 2.5 (CAP_MIB), page cache dropped before each run.
#
# Environment: SMOE_LLAMA_DIR (default /var/cache/smoe-llama), SMOE_BIN (the
# smoe tool; default target/release/smoe), BROAD_BIN (the model generator;
# default: built with cargo), SMOE_LLAMA_CUDA_DIR (default target/llama-cuda), N_PREDICT
# (default 32), LAYERS (24), EXPERTS (64), ROUNDS (2), CAP_MIB, N_CAPPED (8),
# CAPPED_ROUNDS (1), TIER_SHARE (25), TIER_N (128), TIER_MODELS (the tier's models: "broad
# mixtral", the default, or either), TIER_CAPPED (0: no capped tier runs).
set -euo pipefail
MODE="${1:-all}"
case "$MODE" in all | tier) ;; *) echo "usage: scripts/llama-cuda.sh [all|tier]" >&2; exit 2 ;; esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${SMOE_LLAMA_DIR:-/var/cache/smoe-llama}"
BIN="$DIR/build-cuda/bin"
WORK="${SMOE_LLAMA_CUDA_DIR:-$ROOT/target/llama-cuda}"
N_PREDICT="${N_PREDICT:-32}"
LAYERS="${LAYERS:-24}"
EXPERTS="${EXPERTS:-64}"
ROUNDS="${ROUNDS:-2}"
N_CAPPED="${N_CAPPED:-8}"
CAPPED_ROUNDS="${CAPPED_ROUNDS:-1}"

say() { printf '[llama-cuda.sh] %s\n' "$*" >&2; }
die() {
  say "error: $*"
  exit 1
}

for t in llama-completion llama-bench; do
  [ -x "$BIN/$t" ] || die "$BIN/$t is not built: run scripts/llama.sh build --cuda"
done
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive number, not '$ROUNDS'"
mkdir -p "$WORK"

SHORT="Hello world"
LONG="The quick brown fox jumps over the lazy dog while the farmer counts his sheep in the early morning light, and the river runs past the old mill towards the sea."

# make_model PATH MOVE: the broad model at PATH (--move MOVE), made once
make_model() {
  [ -f "$1" ] && return 0
  if [ -z "${BROAD_BIN:-}" ]; then
    (cd "$ROOT" && cargo build --release -p smoe-test-support --example broad_model) >&2 ||
      die "cannot build the model generator (set BROAD_BIN to a built one)"
    BROAD_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/broad_model"
  fi
  say "making $1 (test-support/examples/broad_model.rs, --move $2)"
  "$BROAD_BIN" "$1" --layers "$LAYERS" --experts "$EXPERTS" --move "$2" \
    --vocab "$ROOT/tests/fixtures/models/qwen3moe-q8_0.gguf" >&2 || die "$BROAD_BIN failed"
}
broad="$WORK/broad-${LAYERS}x${EXPERTS}.gguf"
[ "$MODE" = tier ] || make_model "$broad" 1

# pp_tg LOG: prompt tokens/s and decode tokens/s of llama's perf print.
pp_tg() {
  awk '/eval time/ { v = 0; for (i = 3; i <= NF; i++) if ($i == "per" && $(i + 1) ~ /^second/ && $(i - 1) == "tokens") v = $(i - 2) }
       /prompt eval time/ { pp = v; next }
       /[^t] eval time/   { tg = v }
       END { printf "%s %s\n", (pp == "" ? 0 : pp), (tg == "" ? 0 : tg) }' "$1"
}
# offload LOG: smoe's op offload line, shortened.
offload() { grep -h '^smoe: op offload:' "$1" | sed 's/^smoe: op offload: //' | tail -n 1 || true; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }

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

# Whether a memory cgroup can be made here: root, cgroup v2 with its memory
# controller, and the hierarchy writable (a container may mount it
# read-only). Probed first, so that the rounds above still print their table.
can_cap() {
  [ "$(id -u)" -eq 0 ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null || return 1
  grep -qw memory /sys/fs/cgroup/cgroup.subtree_control ||
    echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || return 1
  local probe="/sys/fs/cgroup/smoe-llama-cuda.$$.probe"
  mkdir "$probe" 2>/dev/null || return 1
  local ok=0
  [ -w "$probe/memory.max" ] || ok=1
  rmdir "$probe" 2>/dev/null || true
  return $ok
}
# new_cgroup NAME MIB: a memory cgroup of MIB MiB (no swap), made after the page cache
# is dropped and smoe's cache emptied; prints its path. Run a command in it with
# `bash -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' _ PATH COMMAND...`.
new_cgroup() {
  local cg="/sys/fs/cgroup/smoe-llama-cuda.$$.$1"
  mkdir "$cg"
  echo $(($2 << 20)) >"$cg/memory.max"
  echo 0 >"$cg/memory.swap.max" 2>/dev/null || true
  sync
  echo 3 >/proc/sys/vm/drop_caches
  rm -rf "$WORK/cache"
  echo "$cg"
}
status=0
if [ "$MODE" = tier ]; then
  SMOE_TOOL="${SMOE_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/smoe}"
  [ -x "$SMOE_TOOL" ] || die "$SMOE_TOOL is not built (cargo build --release -p smoe-cli, or set SMOE_BIN)"
  share="${TIER_SHARE:-25}"
  tier_n="${TIER_N:-128}"
  [[ "$share" =~ ^[1-9][0-9]?$ ]] || die "TIER_SHARE must be a percentage from 1 to 99, not '$share'"
  mixtral_like="$WORK/broad-${LAYERS}x${EXPERTS}-move0.3.gguf"
  # tg LOG.csv: llama-bench's decode tokens/s
  tg() {
    awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) { gsub(/"/, "", $i); col[$i] = i } next }
             { gsub(/"/, ""); if ($col["n_gen"] > 0) tg = $col["avg_ts"] } END { printf "%.2f", tg }' "$1"
  }
  # tier_hits LOG: the tier's hit rate from its statistics line
  tier_hits() { sed -n 's/^smoe: device tier: .* lookups, [0-9]* hits (\([0-9.]*%\)[;)].*/\1/p' "$1" | tail -n 1; }
  trows=""
  crows=""
  capped=0
  if [ "${TIER_CAPPED:-1}" = 0 ]; then
    say "skipping the capped runs (TIER_CAPPED=0)"
  elif can_cap; then
    capped=1
  else
    say "skipping the capped runs: they need root and a writable cgroup v2 hierarchy with its memory controller"
  fi
  models=()
  for m in ${TIER_MODELS:-broad mixtral}; do
    case "$m" in
      broad) make_model "$broad" 1 && models+=("$broad") ;;
      mixtral) make_model "$mixtral_like" 0.3 && models+=("$mixtral_like") ;;
      *) die "TIER_MODELS names broad and mixtral, not '$m'" ;;
    esac
  done
  for model in "${models[@]}"; do
    name="$(basename "$model" .gguf)"
    inspect=$("$SMOE_TOOL" inspect "$model") || die "smoe inspect $model failed"
    bytes=$(awk '/^expert bytes/ { print $3 }' <<<"$inspect")
    entries=$(awk '/^experts / { print $2 + 0 }' <<<"$inspect")
    vram=$(((entries * share / 100 + 1) * (bytes / entries) + 1048576))
    common=(-m "$model" -ngl 99 -n "$N_PREDICT" --temp 0 --seed 1 -no-cnv -p "$LONG")
    rm -rf "$WORK/cache"
    complete "$WORK/$name.tier-stock" "$BIN/llama-completion" "${common[@]}" --cpu-moe || status=1
    complete "$WORK/$name.tier-smoe" env SMOE=1 SMOE_VRAM="$vram" SMOE_CACHE_DIR="$WORK/cache" "$BIN/llama-completion" "${common[@]}" ||
      status=1
    t="$(same "$WORK/$name.tier-smoe" "$WORK/$name.tier-stock")"
    [ "$t" = DIFFERENT ] && status=1
    echo "text: $name, smoe with a tier of $share% (SMOE_VRAM=$vram) vs stock --cpu-moe: $t"
    cat "$model" >/dev/null
    for ((r = 1; r <= ROUNDS; r++)); do
      run_tg() { # OUT OPTS ENV...
        local out=$1 opts=$2
        shift 2
        # shellcheck disable=SC2086 # opts is a word list
        env "$@" "$BIN/llama-bench" -m "$model" -ngl 99 $opts -p 16 -n "$tier_n" -r 1 -o csv >"$out.csv" 2>"$out.log" ||
          { say "llama-bench failed: $(tail -n 2 "$out.log")"; echo 0; return; }
        tg "$out.csv"
      }
      s_tg=$(run_tg "$WORK/$name.t-stock-$r" "-ncmoe 99")
      rm -rf "$WORK/cache"
      n_tg=$(run_tg "$WORK/$name.t-smoe-$r" "" SMOE=1 SMOE_CACHE_DIR="$WORK/cache")
      rm -rf "$WORK/cache"
      v_tg=$(run_tg "$WORK/$name.t-tier-$r" "" SMOE=1 SMOE_VRAM="$vram" SMOE_CACHE_DIR="$WORK/cache")
      l_tg=$(run_tg "$WORK/$name.t-gpu-$r" "")
      trows+="| $name, round $r | $s_tg | $n_tg | $v_tg | **$(ratio "$v_tg" "$n_tg")×** | $(tier_hits "$WORK/$name.t-tier-$r.log") | $l_tg | $(ratio "$v_tg" "$l_tg")× |"$'\n'
      if [ "$capped" = 1 ]; then
        # the same two smoe runs in a memory cgroup of the model's size / 2.5, page cache dropped
        model_mib=$(($(stat -c %s "$model") >> 20))
        cap="${CAP_MIB:-$((model_mib * 10 / 25))}"
        capped_tg() { # OUT ENV...
          local out=$1 cg
          shift
          cg=$(new_cgroup tier "$cap")
          run_tg "$out" "" bash -c 'echo $$ >"$1/cgroup.procs"; shift; exec env "$@"' _ "$cg" "$@"
          say "$(basename "$out") under $cap MiB: peak $(($(cat "$cg/memory.peak" 2>/dev/null || echo 0) >> 20)) MiB"
          rmdir "$cg" 2>/dev/null || true
        }
        cn_tg=$(capped_tg "$WORK/$name.c-smoe-$r" SMOE=1 SMOE_CACHE_DIR="$WORK/cache")
        cv_tg=$(capped_tg "$WORK/$name.c-tier-$r" SMOE=1 SMOE_VRAM="$vram" SMOE_CACHE_DIR="$WORK/cache")
        crows+="| $name, round $r | $cap MiB | $cn_tg | $cv_tg | **$(ratio "$cv_tg" "$cn_tg")×** | $(tier_hits "$WORK/$name.c-tier-$r.log") |"$'\n'
      fi
    done
  done
  echo
  echo "Decode tokens/s, -ngl 99, llama-bench -p 16 -n $tier_n, a tier of $share% of the experts; the limit: stock with every expert on the GPU"
  echo
  echo "| model, round | stock --cpu-moe | smoe | smoe + tier | tier ÷ no tier | tier hits | stock, all on GPU | tier ÷ limit |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
  printf '%s' "$trows"
  if [ "$capped" = 1 ]; then
    echo
    echo "The same under a memory cap (a cgroup of the model's size / 2.5, page cache dropped before each run): decode tokens/s"
    echo
    echo "| model, round | cap | smoe | smoe + tier | tier ÷ no tier | tier hits |"
    echo "| --- | --- | --- | --- | --- | --- |"
    printf '%s' "$crows"
  fi
  exit $status
fi
# 1. text
for model in "$ROOT/tests/fixtures/models/qwen3moe-q8_0.gguf" "$broad"; do
  name="$(basename "$model" .gguf)"
  for which in short long; do
    prompt="$SHORT"
    [ "$which" = long ] && prompt="$LONG"
    common=(-m "$model" -ngl 99 -n "$N_PREDICT" --temp 0 --seed 1 -no-cnv -p "$prompt")
    o="$WORK/$name.$which"
    rm -rf "$WORK/cache"
    complete "$o.stock" "$BIN/llama-completion" "${common[@]}" --cpu-moe || status=1
    complete "$o.smoe" env SMOE=1 SMOE_CACHE_DIR="$WORK/cache" "$BIN/llama-completion" "${common[@]}" || status=1
    complete "$o.stock-nopo" "$BIN/llama-completion" "${common[@]}" --cpu-moe --no-op-offload || status=1
    complete "$o.smoe-nopo" env SMOE=1 SMOE_CACHE_DIR="$WORK/cache" SMOE_OP_OFFLOAD=0 "$BIN/llama-completion" "${common[@]}" ||
      status=1
    a="$(same "$o.smoe" "$o.stock")"
    b="$(same "$o.smoe-nopo" "$o.stock-nopo")"
    [ "$a" = DIFFERENT ] || [ "$b" = DIFFERENT ] && status=1
    echo "text: $name, $which prompt, -ngl 99: smoe vs stock --cpu-moe (op offload): $a; both without op offload: $b"
    read -r pp tg <<<"$(pp_tg "$o.stock.log")"
    read -r mpp mtg <<<"$(pp_tg "$o.smoe.log")"
    echo "text:   prompt tokens/s stock $pp, smoe $mpp; decode stock $tg, smoe $mtg; smoe's op offload: $(offload "$o.smoe.log")"
  done
done

# 2. uncapped, alternating
PP=512 # the uncapped prompt's tokens
bench() { # OUT "OPTION..." ENV...: llama-bench's pp$PP and tg64 tokens/s ("pp tg")
  local out=$1 opts=$2
  shift 2
  # shellcheck disable=SC2086 # opts is a word list
  env "$@" "$BIN/llama-bench" -m "$broad" -ngl 99 $opts -p "$PP" -n 64 -r 2 -o csv >"$out.csv" 2>"$out.log" ||
    { say "llama-bench failed: $(tail -n 2 "$out.log")"; return 1; }
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) { gsub(/"/, "", $i); col[$i] = i } next }
           { gsub(/"/, ""); if ($col["n_prompt"] > 0) pp = $col["avg_ts"]; else tg = $col["avg_ts"] }
           END { printf "%.1f %.1f\n", pp, tg }' "$out.csv"
}
rows=""
ahead_rows=""
# MiB of experts copied per token (smoe's op offload line)
mib_token() { offload "$1" | sed -n 's/.*(\([0-9.]*\) MiB a token).*/\1/p'; }
h2d_gbs=""
if [ -n "${SMOE_CUDA_BIN:-}" ]; then
  # the pinned host-to-device copy rate in pieces of one expert's weight (~1 MiB), from a
  # registered mapping as the ring is
  h2d_gbs=$("$SMOE_CUDA_BIN" h2d --mib 2048 --chunk-mib 1 | sed -n '/registered/ s/.*pieces on 2 streams \([0-9.]*\) GB\/s.*/\1/p')
  echo "pinned host-to-device copies of 1 MiB (smoe-cuda h2d --mib 2048 --chunk-mib 1): ${h2d_gbs:-?} GB/s"
fi
cat "$broad" >/dev/null
for ((r = 1; r <= ROUNDS; r++)); do
  s=$(bench "$WORK/bench-stock-$r" "-ncmoe 99") || { status=1; continue; }
  rm -rf "$WORK/cache"
  m=$(bench "$WORK/bench-smoe-$r" "" SMOE=1 SMOE_CACHE_DIR="$WORK/cache") || { status=1; continue; }
  rm -rf "$WORK/cache"
  o=$(bench "$WORK/bench-smoe-in-order-$r" "" SMOE=1 SMOE_CACHE_DIR="$WORK/cache" SMOE_COPY_AHEAD=0) ||
    { status=1; continue; }
  read -r spp stg <<<"$s"
  read -r mpp mtg <<<"$m"
  read -r opp _ <<<"$o"
  rows+="| uncapped, round $r | $spp | $mpp | **$(ratio "$mpp" "$spp")×** | $stg | $mtg | **$(ratio "$mtg" "$stg")×** | $(offload "$WORK/bench-smoe-$r.log") |"$'\n'
  ahead_rows+="$(awk -v a="$mpp" -v o="$opp" -v mib="$(mib_token "$WORK/bench-smoe-$r.log")" -v rate="${h2d_gbs:-0}" -v r="$r" -v pp="$PP" 'BEGIN {
    ta = pp / a * 1000; to = pp / o * 1000; copy = (rate > 0 ? mib * pp * 1048576 / (rate * 1e9) * 1000 : 0)
    printf "| round %d | %.1f | %.1f | **%.2f×** | %.1f ms | %.1f ms | %.2f | %s |", r, o, a, a / o, to, to - ta, mib * pp,
      (copy > 0 ? sprintf("%.1f ms, %.0f%%", copy, 100 * (to - ta) / copy) : "not measured (SMOE_CUDA_BIN)") }')"$'\n'
done

# 3. capped
if can_cap; then
  model_mib=$(($(stat -c %s "$broad") >> 20))
  cap="${CAP_MIB:-$((model_mib * 10 / 25))}"
  for ((i = 0; i < 19; i++)); do printf '%s ' "$LONG"; done >"$WORK/prompt.txt"
  common=(-m "$broad" -ngl 99 -n "$N_CAPPED" --temp 0 --seed 1 -no-cnv -f "$WORK/prompt.txt")
  # the text smoe's must equal: stock at smoe's n_ubatch (the whole prompt), uncapped
  complete "$WORK/capped-stock-ub" "$BIN/llama-completion" "${common[@]}" --cpu-moe -ub 2048 || status=1
  for ((r = 1; r <= CAPPED_ROUNDS; r++)); do
    for run in stock smoe; do
      cg=$(new_cgroup "$run.$r" "$cap")
      if [ "$run" = stock ]; then
        args=("$BIN/llama-completion" "${common[@]}" --cpu-moe)
      else
        args=(env SMOE=1 SMOE_CACHE_DIR="$WORK/cache" "$BIN/llama-completion" "${common[@]}")
      fi
      complete "$WORK/capped-$run-$r" bash -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' _ "$cg" "${args[@]}" || status=1
      echo "capped at $cap MiB (model $model_mib MiB), $run, round $r: peak $(($(cat "$cg/memory.peak" 2>/dev/null || echo 0) >> 20)) MiB"
      rmdir "$cg" 2>/dev/null || true
    done
    t="$(same "$WORK/capped-smoe-$r" "$WORK/capped-stock-ub")"
    [ "$t" = DIFFERENT ] && status=1
    grep -h '^smoe: n_ubatch' "$WORK/capped-smoe-$r.log" | sed 's/^/capped:   /' || true
    read -r spp stg <<<"$(pp_tg "$WORK/capped-stock-$r.log")"
    read -r mpp mtg <<<"$(pp_tg "$WORK/capped-smoe-$r.log")"
    rows+="| capped at $cap MiB, round $r (text vs stock at n_ubatch 2048: $t) | $spp | $mpp | **$(ratio "$mpp" "$spp")×** | $stg | $mtg | **$(ratio "$mtg" "$stg")×** | $(offload "$WORK/capped-smoe-$r.log") |"$'\n'
  done
else
  say "skipping the capped runs: they need root and a writable cgroup v2 hierarchy with its memory controller"
fi

echo
echo "$(basename "$broad") ($(du -h "$broad" | cut -f1)), -ngl 99, tokens/s (uncapped: llama-bench -p $PP -n 64; capped: llama-completion, a prompt of about 2,000 tokens, $N_CAPPED tokens)"
echo
echo "| run | prefill stock --cpu-moe | prefill smoe | smoe ÷ stock | decode stock | decode smoe | smoe ÷ stock | smoe's copies to the GPU |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
printf '%s' "$rows"
echo
echo "Copies ahead (SMOE_COPY_AHEAD, the default) against in order (SMOE_COPY_AHEAD=0), llama-bench -p $PP prefill tokens/s; hidden: the time saved per $PP-token prompt, and its share of the copies' time at the pinned copy rate"
echo
echo "| round | prefill in order | prefill ahead | ahead ÷ in order | in order per prompt | saved per prompt | MiB copied per prompt | copies' time, share hidden |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
printf '%s' "$ahead_rows"
exit $status
