#!/usr/bin/env bash
# Stock llama.cpp against llama.cpp + smoe, side by side, alternating rounds
# (docs/llama.md, docs/performance.md). Not run by CI: root, ~8 GB of disk,
# minutes the first time (the model is made once and cached). Needs no
# Python: a machine with no toolchain runs it from prebuilt binaries
# (LLAMA_BIN, SMOE_BIN, BROAD_BIN below).
#
#   sudo scripts/llama-bench.sh [capped|long|decode|routing|inplace|half|resident|all]   (default all)
#
#   capped    a broad-routing random Qwen3-MoE of ~3.9 GB (24 layers x 64
#             experts, top-8, Q8_0; test-support/examples/broad_model.rs), both runs
#             in a memory cgroup limited to CAP (1.5 GiB), page cache dropped
#             before each: llama-simple, a prompt of 362 tokens, N_PREDICT
#             tokens greedy; stock, and llama.cpp + smoe reading the GGUF in
#             place. The machine's limits are measured in each round beside
#             the two capped runs (a cloud drive's rate moves between
#             minutes): reads alone (the experts at the faster of 16 dd
#             streams with direct I/O, once, and smoe bench --mode scan,
#             cold) and compute alone (stock's prefill, the model in memory,
#             no cap). Prints each run's prefill, time to
#             first token, decode tokens/s, bytes read, peak memory and the
#             drive's idle time, smoe's line (hits, waves per layer, wasted
#             speculative reads), checks the text is identical, and ends
#             with issue 35's table: prefill over the limit, reads per
#             expert, and each run's whole time (smoe's load commits its
#             ring: SMOE_POPULATE).
#   long      the broad model capped as above, a prompt of 2,047 tokens (the
#             sentence 31 times), LONG_PREDICT tokens: stock (llama.cpp's
#             n_ubatch, 512: four ubatches), llama.cpp + smoe reading the
#             GGUF in place with its default n_ubatch (the prompt in one
#             ubatch when the ring is smaller than the model and the compute
#             buffers fit; docs/llama.md), and stock at smoe's n_ubatch,
#             whose text and logits (bitwise) smoe's must equal. Prints each
#             run's prefill time and bytes read, and the reads per expert:
#             bytes read over the model's expert bytes (issue 35); first the
#             limits: the experts read alone at the drive's rate (dd) and
#             stock's prefill with the model in memory (compute alone).
#             Every llama-simple run also prints how long the model's drive
#             had I/O in flight (/sys/dev/block/.../stat) and sat idle.
#   inplace   the broad model capped as above, llama.cpp + smoe reading the
#             GGUF in place (SMOE=1) against the same with its packed vault
#             (SMOE_VAULT), alternating, the same ring: prefill and decode
#             tokens/s of each, in place / vault per round, text identical
#             (issue 34). Not part of `all`.
#   half      the committed qwen3moe-q8_0 fixture (16 experts a layer) with
#             a ring of half a layer's experts (8 slots), no cap: prefill of
#             the same 362-token prompt, smoe's time over stock's per round.
#   decode    issue 48's table: decode under the cap, against the machine's
#             limit. In each round, alternating: compute alone (stock's
#             decode, the model in memory, no cap), stock capped, and
#             llama.cpp + smoe capped reading the GGUF in place with
#             lookahead off (SMOE_LOOKAHEAD=0) and on (the default, or
#             LOOKAHEAD), page cache dropped before each capped run; reads
#             alone is the bytes the run without lookahead read a decoded
#             token at the drive's rate (16 dd streams with direct I/O). The
#             limit is the larger of the two; each run's decode time a token
#             over it, the lookahead's recall and the bytes it read and no
#             claim took, as a table. A short prompt (DECODE_PROMPT), then
#             N_PREDICT tokens (stock capped: STOCK_PREDICT, default 8, its
#             text checked as the start of the others').
#   routing   how much a cache of experts can serve of each model's decode
#             (issue 50): for each --move in ROUTING_MOVES, the broad model's
#             routing over ROUTING_N greedy tokens after DECODE_PROMPT,
#             captured by the glue (SMOE_TRACE, no cap), and for the real
#             Mixtral-8x7B trace where MIXTRAL_TRACE names it: smoe bench
#             --sweep's hit rates at 10%, 25% and 50% of the experts for an
#             exact LRU, the device tier's rule (src/tier/: admission by use
#             count) and Belady's optimum. Not part of `all`.
#   resident  the broad model, no cap, a ring of every expert (decode is all
#             hits): llama-bench -p 361 -n RESIDENT_N with repacking off, stock and
#             smoe alternating, tokens/s and their ratio per round.
#
# Environment:
#   SMOE_BENCH_DIR  work directory (default /var/cache/smoe-llama-bench): the
#                   model, its vaults, every run's output
#   CAP             memory.max of the capped runs (default 1536M)
#   CAPPED_SLOTS    ring slots of the capped smoe run (default 400 of the
#                   default shape, 26% of the experts, 0.98 GiB, leaving room
#                   for the rest under CAP; as many bytes for another shape)
#   ROUNDS          alternating rounds per mode (default 2; half: 2 x ROUNDS)
#   N_PREDICT       tokens generated by the capped runs (default 32)
#   LONG_PREDICT    tokens generated by the long runs (default 1: the prompt's
#                   reads alone, no decode step)
#   RESIDENT_N      tokens generated by llama-bench in resident (default 32)
#   THREADS         CPU threads (default: nproc)
#   BENCH_ARGS      more arguments for llama-bench in resident, both runs (say
#                   "--cpu-strict 1": each thread on its own core)
#   LOOKAHEAD       decode: SMOE_LOOKAHEAD of the run with lookahead (default
#                   1); LOOKAHEAD_WIDTH and LOOKAHEAD_ADAPT likewise
#                   SMOE_LOOKAHEAD_WIDTH and SMOE_LOOKAHEAD_ADAPT
#   DECODE_PROMPT   decode, routing: the prompt (default one sentence of 18 tokens)
#   ROUTING_MOVES   routing: the broad models' --move values (default "0.3 1 3")
#   ROUTING_N       routing: tokens decoded per model (default 300)
#   MIXTRAL_TRACE   routing: the shared Mixtral-8x7B trace, swept as well when
#                   it exists (default ../shared/traces/mixtral-8x7b-decode.csv
#                   beside the checkout)
#   BROAD_MOVE      the broad model's --move (default 1): what each layer adds
#                   to the hidden state, scaled; 3 makes the state move more
#                   between layers (the next layer's experts harder to guess)
#   BROAD_EXPERTS, BROAD_FF
#                   the broad model's experts per layer and expert FFN width
#                   (default 64 and 768; 128 and 384 give the same bytes with
#                   Qwen3-30B-A3B's and Qwen3-235B-A22B's 128 experts a layer,
#                   so half the compute per byte)
#   SMOE_LLAMA_DIR  the cache of scripts/llama.sh, where it builds llama.cpp
#   LLAMA_BIN, SMOE_BIN, BROAD_BIN
#                   all three set: a prebuilt llama.cpp + smoe (a folder with
#                   llama-simple and llama-bench), the smoe tool, and the
#                   model generator (cargo build --release -p
#                   smoe-test-support --example broad_model), instead of
#                   building here (for a machine with no network or
#                   toolchain)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="${1:-all}"
WORK="${SMOE_BENCH_DIR:-/var/cache/smoe-llama-bench}"
CAP="${CAP:-1536M}"
ROUNDS="${ROUNDS:-2}"
N_PREDICT="${N_PREDICT:-32}"
LONG_PREDICT="${LONG_PREDICT:-1}"
RESIDENT_N="${RESIDENT_N:-32}"
THREADS="${THREADS:-$(nproc)}"
BROAD_EXPERTS="${BROAD_EXPERTS:-64}"
BROAD_FF="${BROAD_FF:-768}"
BROAD_MOVE="${BROAD_MOVE:-1}"

say() { printf '[llama-bench] %s\n' "$*" >&2; }
die() {
  say "error: $*"
  exit 1
}

case "$MODE" in capped | long | decode | routing | inplace | half | resident | all) ;; *)
  echo "usage: scripts/llama-bench.sh [capped|long|decode|routing|inplace|half|resident|all]" >&2
  exit 2
  ;;
esac
[ "$(id -u)" -eq 0 ] || die "run as root (cgroup, drop_caches)"
# the memory cgroup: v2 (/sys/fs/cgroup/NAME: memory.max, memory.peak), else
# v1 under this process's own memory cgroup (memory.limit_in_bytes,
# memory.max_usage_in_bytes)
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  grep -qw memory /sys/fs/cgroup/cgroup.controllers || die "the cgroup v2 memory controller is not available"
  CG=/sys/fs/cgroup/smoe-llama-bench
  CG_V2=1
elif [ -d /sys/fs/cgroup/memory ]; then
  CG="/sys/fs/cgroup/memory$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)"
  CG="${CG%/}/smoe-llama-bench"
  CG_V2=0
else
  die "no memory cgroup (v2 at /sys/fs/cgroup, or v1 at /sys/fs/cgroup/memory)"
fi
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive number, not '$ROUNDS'"
[[ "$RESIDENT_N" =~ ^[1-9][0-9]*$ ]] || die "RESIDENT_N must be a positive number, not '$RESIDENT_N'"
[[ "$BROAD_EXPERTS" =~ ^[1-9][0-9]*$ ]] || die "BROAD_EXPERTS must be a positive number, not '$BROAD_EXPERTS'"
[[ "$BROAD_FF" =~ ^[1-9][0-9]*$ ]] || die "BROAD_FF must be a positive number, not '$BROAD_FF'"
[[ "$BROAD_MOVE" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "BROAD_MOVE must be a number, not '$BROAD_MOVE'"
# 400 slots of the default shape's 2.4 MiB experts; as many bytes for another width
CAPPED_SLOTS="${CAPPED_SLOTS:-$((400 * 768 / BROAD_FF))}"

if [ -n "${LLAMA_BIN:-}" ] && [ -n "${SMOE_BIN:-}" ] && [ -n "${BROAD_BIN:-}" ]; then
  BIN_DIR="$(cd "$LLAMA_BIN" && pwd)"
  SIMPLE="$BIN_DIR/llama-simple"
  SMOE="$SMOE_BIN"
  GEN="$BROAD_BIN"
  [ -x "$SIMPLE" ] && [ -x "$BIN_DIR/llama-bench" ] || die "LLAMA_BIN=$LLAMA_BIN has no llama-simple and llama-bench"
  [ -x "$SMOE" ] || die "SMOE_BIN=$SMOE is not an executable"
  [ -x "$GEN" ] || die "BROAD_BIN=$GEN is not an executable"
else
  SIMPLE="$("$ROOT/scripts/llama.sh" build)"
  BIN_DIR="$(dirname "$SIMPLE")"
  (cd "$ROOT" && cargo build --release -p smoe-cli && cargo build --release -p smoe-test-support --example broad_model) >&2
  SMOE="${CARGO_TARGET_DIR:-$ROOT/target}/release/smoe"
  GEN="${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/broad_model"
fi
mkdir -p "$WORK"

# The prompt: 362 tokens of the fixtures' 384-piece vocabulary (one sentence
# of 66 tokens, five times, and the start of a sixth).
prompt() {
  local sentence="The river carries small stones down from the hills, and the town below counts them every spring. "
  printf '%s' "$sentence$sentence$sentence$sentence${sentence}The river carries small stones down from the"
}

# vault GGUF DIR: packs GGUF into DIR once; no histogram from an earlier run
# (no pre-warm from it).
vault() {
  [ -f "$2/experts.smoe" ] || "$SMOE" pack "$1" "$2" >&2
  rm -f "$2/expert_freq.bin"
}

broad_model() {
  # the default shape keeps its old names; another one gets its own files
  local tag=""
  [ "$BROAD_EXPERTS" = 64 ] && [ "$BROAD_FF" = 768 ] || tag="-e$BROAD_EXPERTS-ff$BROAD_FF"
  [ "$BROAD_MOVE" = 1 ] || tag+="-move$BROAD_MOVE"
  BROAD="$WORK/broad$tag-q8_0.gguf"
  VAULT="$WORK/broad$tag-vault"
  if [ ! -f "$BROAD" ]; then
    say "writing the broad-routing model $BROAD (~3.9 GB)"
    "$GEN" "$BROAD" --experts "$BROAD_EXPERTS" --expert-ff "$BROAD_FF" --move "$BROAD_MOVE" \
      --vocab "$ROOT/tests/fixtures/models/qwen3moe-q8_0.gguf" >&2 || die "$GEN failed"
  fi
  local inspect
  inspect=$("$SMOE" inspect "$BROAD") || die "smoe inspect $BROAD failed"
  EXPERT_BYTES=$(awk '/^expert bytes/ { print $3 }' <<<"$inspect")
  ENTRIES=$(awk '/^experts / { print $2 + 0 }' <<<"$inspect")
  LAYERS=$(awk '/^shape / { print $2 + 0 }' <<<"$inspect")
  [ "${EXPERT_BYTES:-0}" -gt 0 ] && [ "${ENTRIES:-0}" -gt 0 ] || die "smoe inspect $BROAD: no experts"
}

cleanup() { rmdir "$CG" 2>/dev/null || true; }
trap cleanup EXIT
LIMIT=max
# cgroup LIMIT: the cgroup every run starts in (LIMIT bytes or "max"), with
# its peak reset (a fresh cgroup each time).
cgroup() {
  LIMIT=$1
  rmdir "$CG" 2>/dev/null || true
  mkdir -p "$CG"
  if [ "$CG_V2" = 1 ]; then
    echo "+memory" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    echo "$1" >"$CG/memory.max"
    echo 0 >"$CG/memory.swap.max" 2>/dev/null || true
  else
    echo "$([ "$1" = max ] && echo -1 || echo "$1")" >"$CG/memory.limit_in_bytes"
  fi
}
peak() {
  if [ "$CG_V2" = 1 ]; then cat "$CG/memory.peak"; else cat "$CG/memory.max_usage_in_bytes"; fi 2>/dev/null || echo 0
}

# disk_ticks FILE: the milliseconds the block device holding FILE has spent with I/O in
# flight since boot (/sys/dev/block/MAJOR:MINOR/stat, field 10); empty when FILE is not on
# a block device this can find.
disk_ticks() {
  local dev
  dev=$(stat -L -c '%d' "$1")
  awk '{ print $10 }' "/sys/dev/block/$((dev >> 8 & 0xfff)):$(((dev & 0xff) | (dev >> 12 & 0xfff00)))/stat" 2>/dev/null || true
}

# simple NAME COLD MODEL PROMPT N ENV...: llama-simple in the cgroup (COLD=1:
# page cache dropped first). Sets LAST to its figures: "prompt_tokens
# prompt_s ttft_s decode_tokens decode_s read_bytes peak_bytes".
simple() {
  local name=$1 cold=$2 model=$3 text=$4 n=$5
  shift 5
  local out="$WORK/$name.out" err="$WORK/$name.err" io="$WORK/$name.io"
  rm -f "$io"
  if [ "$cold" = 1 ]; then
    sync
    echo 3 >/proc/sys/vm/drop_caches
  fi
  cgroup "$LIMIT"
  local ticks0 ticks1 t0 t1
  ticks0=$(disk_ticks "$model")
  t0=$(date +%s.%N)
  bash -c 'echo $$ >"$1/cgroup.procs"; io=$2; shift 2; "$@" & pid=$!
           while kill -0 $pid 2>/dev/null; do cat /proc/$pid/io >"$io.tmp" 2>/dev/null && mv "$io.tmp" "$io"; sleep 0.1; done
           wait $pid' _ "$CG" "$io" env "$@" "$SIMPLE" -t "$THREADS" -m "$model" -n "$n" "$text" >"$out" 2>"$err" ||
    { tail -20 "$err" >&2; die "$name failed (log: $err)"; }
  t1=$(date +%s.%N)
  ticks1=$(disk_ticks "$model")
  local peak read_bytes
  peak=$(peak)
  read_bytes=$(awk '/^read_bytes/ {print $2}' "$io" 2>/dev/null || echo 0)
  # llama_perf_context_print: "load time = X ms" (from the context's creation to the end
  # of its first decode: the time to the first token), "prompt eval time = X ms / N
  # tokens", "eval time = X ms / N runs"
  LAST=$(awk -v rb="${read_bytes:-0}" -v peak="$peak" '
    function num(s) { gsub(/[^0-9.]/, "", s); return s + 0 }
    /prompt eval time =/ { split($0, a, "="); split(a[2], b, "/"); pe = num(b[1]); split(b[2], c, " "); np = c[1] + 0 }
    /[^t] eval time =/   { split($0, a, "="); split(a[2], b, "/"); ev = num(b[1]); split(b[2], c, " "); n = c[1] + 0 }
    /load time =/        { split($0, a, "="); load = num(a[2]) }
    END { printf "%d %.4f %.4f %d %.4f %.0f %.0f\n", np, pe / 1000, load / 1000, n, ev / 1000, rb, peak }' "$err")
  local np ps tt nd ds rb pk
  read -r np ps tt nd ds rb pk <<<"$LAST"
  awk -v name="$name" -v np="$np" -v ps="$ps" -v tt="$tt" -v nd="$nd" -v ds="$ds" -v rb="$rb" -v pk="$pk" 'BEGIN {
    printf "%-14s prefill %d tokens in %.3f s (%.2f tokens/s), first token at %.2f s, decode %d tokens at %.2f tokens/s, read %.2f GiB, peak %.2f GiB\n",
      name, np, ps, (ps > 0 ? np / ps : 0), tt, nd, (ds > 0 ? nd / ds : 0), rb / 1073741824, pk / 1073741824 }'
  grep '^smoe: claims' "$err" | sed 's/^/               /' || true
  # the drive's busy time over the run (load, prefill and decode; with one token, about
  # the prefill): what it was not doing is the time it sat idle
  local busy=-1 wall
  wall=$(awk -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.3f", t1 - t0 }')
  if [ -n "$ticks0" ] && [ -n "$ticks1" ]; then
    busy=$(awk -v k="$((ticks1 - ticks0))" 'BEGIN { printf "%.3f", k / 1000 }')
    awk -v b="$busy" -v w="$wall" 'BEGIN {
      printf "               drive busy %.2f s of the run'"'"'s %.2f s: idle %.2f s (%.0f%%)\n", b, w, (w > b ? w - b : 0), (w > b ? (w - b) / w * 100 : 0) }'
  fi
  # LAST's last two: the drive's busy seconds over the run (-1: unknown) and the run's
  LAST="$LAST $busy $wall"
}

# same A B: the two runs' texts are identical, or the script fails.
same() {
  if cmp -s "$WORK/$1.out" "$WORK/$2.out"; then
    echo "               text of $2 identical to $1's ($(wc -c <"$WORK/$1.out") bytes)"
  else
    echo "               text of $2 DIFFERS from $1's:"
    diff <(fold -w 80 "$WORK/$1.out") <(fold -w 80 "$WORK/$2.out") | head -10
    exit 1
  fi
}

# starts NAME OTHER: OTHER's text is the start of NAME's (a shorter run of the same
# greedy decode), or the script fails.
starts() {
  local n
  # (llama-simple ends its text with a newline)
  n=$(($(wc -c <"$WORK/$2.out") - 1))
  if [ "$n" -gt 0 ] && cmp -s -n "$n" "$WORK/$1.out" "$WORK/$2.out"; then
    echo "               text of $2 is the start of $1's ($n bytes)"
  else
    echo "               text of $2 DIFFERS from the start of $1's"
    exit 1
  fi
}

# ratio A B: A / B, two decimals.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }

# drive FILE: what the drive reads of FILE with direct I/O, 16 dd streams of 4 MiB
# reads over its 16 parts, page cache dropped first: "GB/s seconds". Dies when FILE
# is under 64 MiB or a read fails (a file system without direct I/O).
drive() {
  local size n i t0 t1 pids=()
  size=$(stat -c %s "$1")
  n=$((size / 4194304 / 16))
  [ "$n" -gt 0 ] || die "$1: too small to time the drive ($size bytes)"
  sync
  echo 3 >/proc/sys/vm/drop_caches
  t0=$(date +%s.%N)
  for ((i = 0; i < 16; i++)); do
    dd if="$1" of=/dev/null bs=4M iflag=direct skip=$((i * n)) count=$n status=none &
    pids+=($!)
  done
  for i in "${pids[@]}"; do
    wait "$i" || die "dd of $1 with direct I/O failed"
  done
  t1=$(date +%s.%N)
  awk -v b=$((n * 16 * 4194304)) -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.2f %.2f\n", b / (t1 - t0) / 1e9, t1 - t0 }'
}

# scan_seconds: the seconds `smoe bench --mode scan` takes to read every expert of the
# broad model once, cold (empty when it fails)
scan_seconds() {
  sync
  echo 3 >/proc/sys/vm/drop_caches
  SMOE_CACHE_DIR="$WORK/scan-cache" "$SMOE" bench "$BROAD" --mode scan 2>/dev/null |
    awk '/^scan:/ { for (i = 1; i < NF; i++) if ($(i + 1) == "s") { print $i; exit } }' || true
  rm -rf "$WORK/scan-cache"
}

capped() {
  broad_model
  local text
  text=$(prompt)
  echo "== capped: $(basename "$BROAD") ($(du -hL "$BROAD" | cut -f1), experts $(awk -v b="$EXPERT_BYTES" 'BEGIN { printf "%.2f GiB", b / 1073741824 }')), memory.max $CAP, cold page cache, -t $THREADS, llama.cpp + smoe reading the GGUF in place with $CAPPED_SLOTS ring slots, $N_PREDICT token(s)"
  # the machine's limits: reads alone (the experts at the drive's rate, the faster of 16
  # dd streams and smoe's scan: on this broad model the prompt routes to every expert,
  # none resident at its start) and compute alone (stock, no cap, the model in the page
  # cache)
  local gbs secs reads compute limit x
  gbs=$(drive "$BROAD") || exit 1
  read -r gbs secs <<<"$gbs"
  reads=$(awk -v b="$EXPERT_BYTES" -v g="$gbs" 'BEGIN { printf "%.3f", b / g / 1e9 }')
  echo "reads alone: the experts at $gbs GB/s (16 dd streams with direct I/O over the model, $secs s): $reads s"
  local r cache="$WORK/capped-cache" rows="" s_np s_ps s_dn s_ds s_rb s_wall m_np m_ps m_dn m_ds m_rb m_busy m_wall
  local dd_reads=$reads scan
  for ((r = 1; r <= ROUNDS; r++)); do
    # compute alone in every round, beside the capped runs: on a shared machine its
    # time moves by 10% and more between minutes
    cgroup max
    cat "$BROAD" >/dev/null
    simple "capped-memory-$r" 0 "$BROAD" "$text" "$N_PREDICT"
    read -r x compute x <<<"$LAST"
    # reads alone in every round too, as smoe's own workers read the experts, once
    # each, cold: a cloud drive's rate moves by 20% and more between minutes; the
    # faster of this and the dd streams is the drive's rate
    scan=$(scan_seconds)
    reads=$dd_reads
    if [ -n "$scan" ]; then
      reads=$(awk -v a="$dd_reads" -v b="$scan" 'BEGIN { printf "%.3f", (b < a ? b : a) }')
    fi
    echo "round $r: reads alone by smoe bench --mode scan (16 workers, direct I/O, cold): ${scan:-failed} s"
    limit=$(awk -v a="$compute" -v b="$reads" 'BEGIN { printf "%.3f", (a > b ? a : b) }')
    echo "round $r: compute alone (stock, the model in memory): $compute s; the limit: $limit s"
    cgroup "$(numfmt --from=iec "$CAP")"
    simple "capped-stock-$r" 1 "$BROAD" "$text" "$N_PREDICT"
    read -r s_np s_ps x s_dn s_ds s_rb x x s_wall <<<"$LAST"
    rm -rf "$cache" # each round from the same start: no histogram, no pre-warm
    simple "capped-smoe-$r" 1 "$BROAD" "$text" "$N_PREDICT" SMOE=1 SMOE_CACHE_DIR="$cache" SMOE_RING_SLOTS="$CAPPED_SLOTS"
    read -r m_np m_ps x m_dn m_ds m_rb x m_busy m_wall <<<"$LAST"
    same "capped-stock-1" "capped-stock-$r"
    same "capped-stock-1" "capped-smoe-$r"
    echo "round $r: prefill smoe $m_ps s, stock $s_ps s: smoe / the limit $(ratio "$m_ps" "$limit")x, stock / the limit $(ratio "$s_ps" "$limit")x$([ "$s_dn" -gt 0 ] && echo "; smoe/stock decode tokens/s $(ratio "$(ratio "$m_dn" "$m_ds")" "$(ratio "$s_dn" "$s_ds")")x")"
    rows+="| $r | $compute s | $reads s | $limit s | $s_ps s | $m_ps s | **$(ratio "$m_ps" "$limit")×** | $(awk -v b="$m_busy" -v w="$m_wall" 'BEGIN { if (b < 0) print "unknown"; else printf "%.2f s of %.2f s", (w > b ? w - b : 0), w }') | $(ratio "$s_rb" "$EXPERT_BYTES"), $(ratio "$m_rb" "$EXPERT_BYTES") | $s_wall s, $m_wall s |"$'\n'
  done
  echo
  echo "| round | compute alone | reads alone | limit | stock capped | smoe capped | smoe ÷ limit | drive idle in smoe's run | reads per expert: stock, smoe | whole run (load, prefill, decode): stock, smoe |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  printf '%s' "$rows"
}

long() {
  broad_model
  local text="" i cache="$WORK/long-cache" experts
  for ((i = 0; i < 31; i++)); do text+="The river carries small stones down from the hills, and the town below counts them every spring. "; done
  text="${text% }"
  experts=$EXPERT_BYTES
  echo "== long: $(basename "$BROAD") ($(du -hL "$BROAD" | cut -f1), experts $(awk -v b="$experts" 'BEGIN { printf "%.2f GiB", b / 1073741824 }')), memory.max $CAP, cold page cache, -t $THREADS, $CAPPED_SLOTS ring slots, a prompt of 2,047 tokens, $LONG_PREDICT token(s)"
  # the machine's limits: reads alone (the experts at the drive's rate, dd with direct
  # I/O) and compute alone (stock, no cap, the model in the page cache, at 512 and at
  # n_batch)
  local gbs secs
  gbs=$(drive "$BROAD") || exit 1
  read -r gbs secs <<<"$gbs"
  echo "reads alone: the experts at $gbs GB/s (16 dd streams with direct I/O over the model, $secs s): $(awk -v b="$experts" -v g="$gbs" 'BEGIN { printf "%.2f", b / g / 1e9 }') s"
  cgroup max
  cat "$BROAD" >/dev/null
  simple "long-memory-512" 0 "$BROAD" "$text" "$LONG_PREDICT"
  simple "long-memory-2047" 0 "$BROAD" "$text" "$LONG_PREDICT" SMOE_SIMPLE_UBATCH=2047
  cgroup "$(numfmt --from=iec "$CAP")"
  local r ub s_ps s_rb m_ps m_rb u_ps u_rb x
  for ((r = 1; r <= ROUNDS; r++)); do
    simple "long-stock-$r" 1 "$BROAD" "$text" "$LONG_PREDICT" SMOE_DUMP_LOGITS="$WORK/long-stock-$r.logits"
    read -r x s_ps x x x s_rb x <<<"$LAST"
    rm -rf "$cache" # no histogram from an earlier run: no pre-warm
    simple "long-smoe-$r" 1 "$BROAD" "$text" "$LONG_PREDICT" SMOE=1 SMOE_CACHE_DIR="$cache" SMOE_RING_SLOTS="$CAPPED_SLOTS" \
      SMOE_DUMP_LOGITS="$WORK/long-smoe-$r.logits"
    read -r x m_ps x x x m_rb x <<<"$LAST"
    grep '^smoe: n_ubatch' "$WORK/long-smoe-$r.err" | sed 's/^/               /' || true
    # the n_ubatch smoe ran, as the patched llama-simple reports it
    ub=$(awk '/^main: n_ubatch [0-9]+$/ { ub = $3 } END { print ub + 0 }' "$WORK/long-smoe-$r.err")
    [ "$ub" -gt 0 ] || ub=512
    # stock at smoe's n_ubatch: the reference for its logits
    simple "long-stock-ub$ub-$r" 1 "$BROAD" "$text" "$LONG_PREDICT" SMOE_SIMPLE_UBATCH="$ub" \
      SMOE_DUMP_LOGITS="$WORK/long-stock-ub$ub-$r.logits"
    read -r x u_ps x x x u_rb x <<<"$LAST"
    same "long-stock-ub$ub-$r" "long-smoe-$r"
    if cmp -s "$WORK/long-stock-$r.out" "$WORK/long-smoe-$r.out"; then
      echo "               text of long-smoe-$r identical to long-stock-$r's too (stock at n_ubatch 512)"
    else
      echo "               text of long-smoe-$r differs from long-stock-$r's (stock at n_ubatch 512: its sums grouped otherwise)"
    fi
    if cmp -s "$WORK/long-stock-ub$ub-$r.logits" "$WORK/long-smoe-$r.logits"; then
      echo "               logits of long-smoe-$r bitwise equal to long-stock-ub$ub-$r's ($(stat -c %s "$WORK/long-smoe-$r.logits") bytes)"
    else
      echo "               logits of long-smoe-$r DIFFER from long-stock-ub$ub-$r's"
      exit 1
    fi
    echo "round $r: reads per expert (bytes read / the model's expert bytes): stock (n_ubatch 512) $(ratio "$s_rb" "$experts"), stock (n_ubatch $ub) $(ratio "$u_rb" "$experts"), smoe (n_ubatch $ub) $(ratio "$m_rb" "$experts"); prefill time smoe / stock (512) $(ratio "$m_ps" "$s_ps")x, smoe / stock ($ub) $(ratio "$m_ps" "$u_ps")x"
  done
}

# decode_figures NAME: from NAME's `smoe: decode:` line, "bytes_read tokens recall% waste%"
# (zeros when the run printed none).
decode_figures() {
  awk '/^smoe: decode: / {
      tokens = $3
      for (i = 1; i <= NF; i++) {
        if ($i == "recall") { r = $(i + 1); gsub(/%/, "", r) }
        if ($i == "read" && $(i + 2) == "MiB") mib = $(i + 1)
        if ($i == "bytes" && $(i + 1) == "read);") { w = $(i - 3); gsub(/[(%]/, "", w) }
      }
      printf "%.0f %d %s %s\n", mib * 1048576, tokens, r, w; found = 1 }
    END { if (!found) print "0 0 0 0" }' "$WORK/$1.err"
}

decode() {
  broad_model
  local text="${DECODE_PROMPT:-The river carries small stones down from the hills, and the town below}"
  local look=() cache="$WORK/decode-cache"
  look+=(SMOE_LOOKAHEAD="${LOOKAHEAD:-1}")
  [ -n "${LOOKAHEAD_WIDTH:-}" ] && look+=(SMOE_LOOKAHEAD_WIDTH="$LOOKAHEAD_WIDTH")
  [ -n "${LOOKAHEAD_ADAPT:-}" ] && look+=(SMOE_LOOKAHEAD_ADAPT="$LOOKAHEAD_ADAPT")
  echo "== decode: $(basename "$BROAD") ($(du -hL "$BROAD" | cut -f1), experts $(awk -v b="$EXPERT_BYTES" 'BEGIN { printf "%.2f GiB", b / 1073741824 }'), --move $BROAD_MOVE), memory.max $CAP, cold page cache, -t $THREADS, $CAPPED_SLOTS ring slots, $N_PREDICT tokens, lookahead ${LOOKAHEAD:-1} x ${LOOKAHEAD_WIDTH:-top-k}, adapting ${LOOKAHEAD_ADAPT:-1}"
  local gbs secs
  gbs=$(drive "$BROAD") || exit 1
  read -r gbs secs <<<"$gbs"
  echo "the drive: $gbs GB/s (16 dd streams with direct I/O over the model, $secs s)"
  local dd_gbs=$gbs scan
  local r x rows="" c_dn c_ds s_dn s_ds o_dn o_ds n_dn n_ds o_b o_t o_r o_w n_b n_t n_r n_w
  local compute reads limit stock off on
  for ((r = 1; r <= ROUNDS; r++)); do
    # the drive's rate in every round, the faster of the dd streams and smoe's own
    # workers reading every expert once, cold (a cloud drive's rate moves between minutes)
    scan=$(scan_seconds)
    gbs=$dd_gbs
    if [ -n "$scan" ]; then
      gbs=$(awk -v a="$dd_gbs" -v s="$scan" -v b="$EXPERT_BYTES" 'BEGIN { r = b / s / 1e9; printf "%.2f", (r > a ? r : a) }')
    fi
    echo "round $r: the drive at $gbs GB/s (smoe bench --mode scan: ${scan:-failed} s for the experts; dd: $dd_gbs GB/s)"
    cgroup max
    cat "$BROAD" >/dev/null
    simple "decode-memory-$r" 0 "$BROAD" "$text" "$N_PREDICT"
    read -r x x x c_dn c_ds x x <<<"$LAST"
    cgroup "$(numfmt --from=iec "$CAP")"
    simple "decode-stock-$r" 1 "$BROAD" "$text" "${STOCK_PREDICT:-8}"
    read -r x x x s_dn s_ds x x <<<"$LAST"
    rm -rf "$cache"
    simple "decode-off-$r" 1 "$BROAD" "$text" "$N_PREDICT" SMOE=1 SMOE_CACHE_DIR="$cache" SMOE_RING_SLOTS="$CAPPED_SLOTS" SMOE_LOOKAHEAD=0
    read -r x x x o_dn o_ds x x <<<"$LAST"
    grep '^smoe: decode' "$WORK/decode-off-$r.err" | sed 's/^/               /' || true
    rm -rf "$cache"
    simple "decode-on-$r" 1 "$BROAD" "$text" "$N_PREDICT" SMOE=1 SMOE_CACHE_DIR="$cache" SMOE_RING_SLOTS="$CAPPED_SLOTS" "${look[@]}"
    read -r x x x n_dn n_ds x x <<<"$LAST"
    grep '^smoe: decode' "$WORK/decode-on-$r.err" | sed 's/^/               /' || true
    starts "decode-memory-1" "decode-stock-$r"
    same "decode-memory-1" "decode-off-$r"
    same "decode-memory-1" "decode-on-$r"
    read -r o_b o_t o_r o_w <<<"$(decode_figures "decode-off-$r")"
    read -r n_b n_t n_r n_w <<<"$(decode_figures "decode-on-$r")"
    # seconds a decoded token: llama.cpp's eval time over its runs
    compute=$(awk -v n="$c_dn" -v s="$c_ds" 'BEGIN { printf "%.4f", (n > 0 ? s / n : 0) }')
    reads=$(awk -v b="$o_b" -v t="$o_t" -v g="$gbs" 'BEGIN { printf "%.4f", (t > 0 ? b / t / g / 1e9 : 0) }')
    limit=$(awk -v a="$compute" -v b="$reads" 'BEGIN { printf "%.4f", (a > b ? a : b) }')
    stock=$(awk -v n="$s_dn" -v s="$s_ds" 'BEGIN { printf "%.4f", (n > 0 ? s / n : 0) }')
    off=$(awk -v n="$o_dn" -v s="$o_ds" 'BEGIN { printf "%.4f", (n > 0 ? s / n : 0) }')
    on=$(awk -v n="$n_dn" -v s="$n_ds" 'BEGIN { printf "%.4f", (n > 0 ? s / n : 0) }')
    echo "round $r: a decoded token: compute alone $compute s, reads alone $reads s ($(awk -v b="$o_b" -v t="$o_t" 'BEGIN { printf "%.1f MiB", (t > 0 ? b / t / 1048576 : 0) }') at $gbs GB/s), limit $limit s; stock $stock s, smoe off $off s, on $on s: on / off $(ratio "$on" "$off")x"
    rows+="| $r | $compute s | $reads s | $limit s | $stock s ($(ratio "$stock" "$limit")×) | $off s ($(ratio "$off" "$limit")×) | $on s (**$(ratio "$on" "$limit")×**) | $(ratio "$on" "$off")× | ${n_r}% | ${n_w}% |"$'\n'
  done
  echo
  echo "| round | compute alone | reads alone | limit | stock capped (÷ limit) | smoe, lookahead off | smoe, lookahead on | on ÷ off | recall | read, never claimed |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  printf '%s' "$rows"
}

inplace() {
  broad_model
  vault "$BROAD" "$VAULT"
  local text cache="$WORK/inplace-cache"
  text=$(prompt)
  echo "== inplace: $(basename "$BROAD") ($(du -hL "$BROAD" | cut -f1)) read in place (SMOE=1) against its vault (SMOE_VAULT), memory.max $CAP, cold page cache, -t $THREADS, $CAPPED_SLOTS ring slots"
  cgroup "$(numfmt --from=iec "$CAP")"
  local r v_np v_ps v_dn v_ds i_np i_ps i_dn i_ds x
  for ((r = 1; r <= ROUNDS; r++)); do
    rm -f "$VAULT/expert_freq.bin" # each round from the same start: no pre-warm
    simple "inplace-vault-$r" 1 "$BROAD" "$text" "$N_PREDICT" SMOE_VAULT="$VAULT" SMOE_RING_SLOTS="$CAPPED_SLOTS"
    read -r v_np v_ps x v_dn v_ds x x <<<"$LAST"
    rm -rf "$cache" # the model's histogram lives here: none from an earlier run
    simple "inplace-model-$r" 1 "$BROAD" "$text" "$N_PREDICT" SMOE=1 SMOE_CACHE_DIR="$cache" SMOE_RING_SLOTS="$CAPPED_SLOTS"
    read -r i_np i_ps x i_dn i_ds x x <<<"$LAST"
    same "inplace-vault-1" "inplace-vault-$r"
    same "inplace-vault-1" "inplace-model-$r"
    echo "round $r: in place / vault prefill tokens/s $(ratio "$v_ps" "$i_ps")x, decode tokens/s $(ratio "$(ratio "$i_dn" "$i_ds")" "$(ratio "$v_dn" "$v_ds")")x"
  done
}

half() {
  local model="$ROOT/tests/fixtures/models/qwen3moe-q8_0.gguf" text
  vault "$model" "$WORK/half-vault"
  text=$(prompt)
  echo "== half: $(basename "$model"), ring of 8 slots (half of a layer's 16 experts), no cap, repacking off, -t $THREADS"
  cgroup max
  simple "half-warmup" 0 "$model" "$text" 4 SMOE_NO_REPACK=1 >/dev/null
  local r s_ps m_ps x
  for ((r = 1; r <= 2 * ROUNDS; r++)); do
    simple "half-stock-$r" 0 "$model" "$text" 4 SMOE_NO_REPACK=1
    read -r x s_ps x x x x x <<<"$LAST"
    simple "half-smoe-$r" 0 "$model" "$text" 4 SMOE_NO_REPACK=1 SMOE_VAULT="$WORK/half-vault" SMOE_RING_SLOTS=8
    read -r x m_ps x x x x x <<<"$LAST"
    same "half-stock-$r" "half-smoe-$r"
    echo "round $r: smoe's prefill time / stock's $(ratio "$m_ps" "$s_ps")x"
  done
}

# bench NAME ENV...: llama-bench -p 361 -n RESIDENT_N, repacking off; sets LAST to
# "pp_tokens_per_s tg_tokens_per_s".
bench() {
  local name=$1
  shift
  env "$@" "$BIN_DIR/llama-bench" -m "$BROAD" -t "$THREADS" -p 361 -n "$RESIDENT_N" -r 3 --repack 0 ${BENCH_ARGS:-} -o csv \
    >"$WORK/$name.csv" 2>"$WORK/$name.err" || { tail -20 "$WORK/$name.err" >&2; die "$name failed (log: $WORK/$name.err)"; }
  # the csv's header names the columns (n_prompt, n_gen, avg_ts); its rows quote every
  # field (one may hold commas)
  LAST=$(awk -F'","' 'NR == 1 { n = split($0, h, ","); for (i = 1; i <= n; i++) col[h[i]] = i; next }
    { sub(/^"/, ""); sub(/"$/, "") }
    $col["n_prompt"] > 0 && $col["n_gen"] == 0 && pp == "" { pp = $col["avg_ts"] }
    $col["n_gen"] > 0 && $col["n_prompt"] == 0 && tg == "" { tg = $col["avg_ts"] }
    END { if (pp == "" || tg == "") exit 1; print pp, tg }' "$WORK/$name.csv") || die "$name: no pp and tg rows in $WORK/$name.csv"
  local pp tg
  read -r pp tg <<<"$LAST"
  printf '%-14s pp361 %.2f tokens/s, tg%s %.2f tokens/s\n' "$name" "$pp" "$RESIDENT_N" "$tg"
  grep '^smoe: claims' "$WORK/$name.err" | sed 's/^/               /' || true
}

# sweep_row NAME TRACE TOP_K VAULT ENTRIES: one row of the routing table, from smoe bench
# --sweep's text (slots, % experts, LRU, Belady, tier) at 10%, 25% and 50% of the experts
sweep_row() {
  local name=$1 trace=$2 top_k=$3 vault=$4 entries=$5 out
  out=$("$SMOE" bench "$vault" --trace "$trace" --top-k "$top_k" --sweep) || die "smoe bench --sweep $trace failed"
  local row="$name" p n cells
  for p in 10 25 50; do
    n=$(((entries * p + 50) / 100))
    cells=$(awk -v n="$n" '$1 == n { printf "%s %s %s", $3, $5, $4 }' <<<"$out")
    [ -n "$cells" ] || die "no sweep row of $n slots for $trace"
    row+=" | ${cells// / | }"
  done
  echo "| $row |"
}

routing() {
  local text="${DECODE_PROMPT:-The river carries small stones down from the hills, and the town below}"
  local n="${ROUTING_N:-300}" moves="${ROUTING_MOVES:-0.3 1 3}"
  local mixtral="${MIXTRAL_TRACE:-$ROOT/../shared/traces/mixtral-8x7b-decode.csv}"
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "ROUTING_N must be a positive number, not '$n'"
  local vault
  echo "== routing: $n greedy tokens after \"$text\" (-t $THREADS, no cap), captured with SMOE_TRACE; smoe bench --sweep"
  echo "(sizes rounded as the sweep rounds them: 26 of 256 slots is 10.2%; Belady keeps every miss, the tier may let one pass)"
  echo "| routing | LRU 10% | tier 10% | Belady 10% | LRU 25% | tier 25% | Belady 25% | LRU 50% | tier 50% | Belady 50% |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  local move trace
  for move in $moves; do
    [[ "$move" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "ROUTING_MOVES: '$move' is not a number"
    BROAD_MOVE=$move
    broad_model
    # a vault of the model's shape for the sweep (it streams nothing: only its shape counts)
    vault="$WORK/routing-vault-${LAYERS}x$BROAD_EXPERTS"
    [ -f "$vault/experts.smoe" ] || "$SMOE" synth "$vault" --layers "$LAYERS" --experts "$BROAD_EXPERTS" --blob-kib 4 >&2
    trace="$WORK/routing-move$move.csv"
    rm -f "$trace"
    rm -rf "$WORK/routing-cache"
    SMOE=1 SMOE_TRACE="$trace" SMOE_CACHE_DIR="$WORK/routing-cache" \
      "$SIMPLE" -m "$BROAD" -n "$n" -t "$THREADS" "$text" >"$WORK/routing-move$move.out" 2>"$WORK/routing-move$move.err" ||
      die "llama-simple on $BROAD failed: $WORK/routing-move$move.err"
    [ -s "$trace" ] || die "no trace written: $WORK/routing-move$move.err"
    sweep_row "$(basename "$BROAD") ($ENTRIES experts, top-8)" "$trace" 8 "$vault" "$ENTRIES"
  done
  if [ -f "$mixtral" ]; then
    local mvault="$WORK/routing-vault-mixtral"
    [ -f "$mvault/experts.smoe" ] || "$SMOE" synth "$mvault" --layers 32 --experts 8 --blob-kib 4 >&2
    sweep_row "Mixtral-8x7B trace (256 experts, top-2)" "$mixtral" 2 "$mvault" 256
  else
    say "no Mixtral trace at $mixtral (MIXTRAL_TRACE): its row left out"
  fi
}

resident() {
  broad_model
  local entries=$ENTRIES cache="$WORK/resident-cache"
  echo "== resident: $(basename "$BROAD"), no cap, a ring of all $entries experts, llama-bench -p 361 -n $RESIDENT_N -r 3 --repack 0 ${BENCH_ARGS:-}, -t $THREADS"
  cgroup max
  cat "$BROAD" >/dev/null # warm page cache for stock's mmap
  local r s_pp s_tg m_pp m_tg
  for ((r = 1; r <= ROUNDS; r++)); do
    bench "resident-stock-$r"
    read -r s_pp s_tg <<<"$LAST"
    rm -rf "$cache"
    bench "resident-smoe-$r" SMOE=1 SMOE_CACHE_DIR="$cache" SMOE_RING_SLOTS="$entries"
    read -r m_pp m_tg <<<"$LAST"
    echo "round $r: smoe/stock prefill $(ratio "$m_pp" "$s_pp")x, decode $(ratio "$m_tg" "$s_tg")x"
  done
}

say "llama.cpp: $BIN_DIR; uptime: $(uptime)"
case "$MODE" in
  capped) capped ;;
  long) long ;;
  decode) decode ;;
  routing) routing ;;
  inplace) inplace ;;
  half) half ;;
  resident) resident ;;
  all)
    capped
    half
    resident
    ;;
esac
