#!/usr/bin/env bash
# Sanitizer runs for smoe's lock-free code: Miri and ThreadSanitizer (nightly).
#
# Usage: scripts/sanitizers.sh [PART...]       (from anywhere; no PART = all)
#
# Parts, in order:
#   miri          Miri (UB, Stacked Borrows, data races, weak-memory emulation)
#                 over the unit tests of the Vyukov queue (src/queue.rs) and
#                 the slot table (src/streamer/slots/, every room's tests):
#                   cargo +nightly miri test --lib -- queue::tests streamer::slots::
#                 The queue tests scale their loop counts down under cfg(miri).
#   miri-seeds    The one multi-threaded Miri test (4 producers x 4 consumers
#                 through a 16-cell queue) again under SMOE_MIRI_SEEDS
#                 scheduler/weak-memory seeds (-Zmiri-many-seeds), so more
#                 interleavings and stale-load choices are explored.
#   tsan-lib      ThreadSanitizer over the same unit tests, real threads and
#                 full counts (400 000 items through the MPMC test).
#   tsan-stress   ThreadSanitizer over tests/alone/stress.rs (the `alone`
#                 binary, filtered to `stress::`): 8 threads prefetch,
#                 claim, hold and release through a ring smaller than the
#                 working set while 6 I/O workers park and wake; every claimed
#                 byte is checked. SMOE_STRESS_OPS ops per thread (default
#                 here 20000, the test's own default is 200000).
#   tsan-streamer ThreadSanitizer over tests/library/streamer.rs (the
#                 `library` binary, filtered to `streamer::`; integration tests:
#                 eviction, I/O errors, close with reads in flight, ...).
#
# TSAN builds std itself (-Zbuild-std, needs rust-src) with
# -Zsanitizer=thread, for an explicit --target so that build scripts
# (build.rs runs cbindgen) and proc-macros are built natively, without the
# sanitizer. TSAN_OPTIONS gets halt_on_error=1, so the first report fails the
# run. Note that TSAN does not model standalone fences: the SeqCst fences in
# src/streamer/worker.rs (park/wake, a Dekker handshake) only prevent lost
# wake-ups; no data is published through them (slot bytes are published by
# the slot state word, queue items by the cell sequence, both release/acquire),
# so TSAN cannot report a false race from them. A lost wake-up would show as a
# stuck claim_wait ("no data in 10 s") instead.
#
# Each tool uses its own target directory (target/miri, target/tsan), so the
# normal build is not disturbed. CI=1 is exported so build.rs does not rewrite
# include/smoe.h from these builds.
#
# Installs: the nightly toolchain (if missing) and its miri and rust-src
# components, via rustup. Nothing else.
#
# Environment:
#   SMOE_STRESS_OPS   ops per thread for tsan-stress (default 20000)
#   SMOE_MIRI_SEEDS   seed count for miri-seeds (default 8; 0 skips the part)
#   SANITIZER_TOOLCHAIN  rustup toolchain (default nightly)
#
# Prints a summary with each part's time; exits 1 if any part failed (every
# selected part runs even after a failure). On the development machine
# (2 vCPUs), from clean target dirs: miri ~2 min (mostly building), miri-seeds
# ~1.5 min, TSAN build ~5 min, tsan-lib ~15 s, tsan-stress ~1 min,
# tsan-streamer ~10 s.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -d "$HOME/.cargo/bin" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi

TOOLCHAIN=${SANITIZER_TOOLCHAIN:-nightly}
STRESS_OPS=${SMOE_STRESS_OPS:-20000}
MIRI_SEEDS=${SMOE_MIRI_SEEDS:-8}
ALL_PARTS=(miri miri-seeds tsan-lib tsan-stress tsan-streamer)
MIRI_FILTERS=(queue::tests streamer::slots::)

export CI=1
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

if [ $# -gt 0 ]; then
  PARTS=("$@")
else
  PARTS=("${ALL_PARTS[@]}")
fi
for part in "${PARTS[@]}"; do
  case " ${ALL_PARTS[*]} " in
    *" $part "*) ;;
    *)
      echo "unknown part '$part'; parts: ${ALL_PARTS[*]}" >&2
      exit 2
      ;;
  esac
done

START=$(date +%s)
SUMMARY=()
FAILED=0

# part NAME COMMAND...: runs COMMAND, records its time and whether it passed.
# A failing part does not stop the script; the exit status says it failed.
part() {
  local name=$1
  shift
  local start status
  start=$(date +%s)
  echo
  echo "=== ${name}: $*"
  if "$@"; then
    status=ok
  else
    status="FAILED (exit $?)"
    FAILED=1
  fi
  local seconds=$(($(date +%s) - start))
  echo "=== ${name}: ${status} in ${seconds}s"
  SUMMARY+=("$(printf '%-14s %5ds  %s' "$name" "$seconds" "$status")")
}

selected() {
  case " ${PARTS[*]} " in *" $1 "*) return 0 ;; esac
  return 1
}

# (Runs as an `if` condition, where `set -e` is off: each step checks.)
install() {
  local toolchains
  toolchains=$(rustup toolchain list) || return 1
  if ! grep -q "^${TOOLCHAIN}" <<<"$toolchains"; then
    rustup toolchain install "$TOOLCHAIN" --profile minimal || return 1
  fi
  rustup "+$TOOLCHAIN" component add miri rust-src || return 1
  rustc "+$TOOLCHAIN" --version || return 1
  # Builds Miri's sysroot once (otherwise the first `cargo miri` does it).
  if selected miri || selected miri-seeds; then
    cargo "+$TOOLCHAIN" miri setup || return 1
  fi
}

# The host triple: TSAN needs an explicit --target (see the header).
host_triple() {
  rustc "+$TOOLCHAIN" -vV | sed -n 's/^host: //p'
}

miri_env() {
  env CARGO_TARGET_DIR=target/miri "$@"
}

run_miri() {
  miri_env cargo "+$TOOLCHAIN" miri test -p smoe --lib -- "${MIRI_FILTERS[@]}"
}

run_miri_seeds() {
  if [ "$MIRI_SEEDS" -eq 0 ]; then
    echo "SMOE_MIRI_SEEDS=0: skipped"
    return 0
  fi
  miri_env MIRIFLAGS="${MIRIFLAGS:-} -Zmiri-many-seeds=0..${MIRI_SEEDS}" \
    cargo "+$TOOLCHAIN" miri test -p smoe --lib -- \
    queue::tests::many_producers_many_consumers_each_item_once --exact
}

# tsan ARGS...: `cargo test` of ARGS under ThreadSanitizer.
tsan() {
  local target
  target=$(host_triple)
  env CARGO_TARGET_DIR=target/tsan \
    RUSTFLAGS="-Zsanitizer=thread" \
    RUSTDOCFLAGS="-Zsanitizer=thread" \
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" \
    cargo "+$TOOLCHAIN" test -p smoe -Zbuild-std --target "$target" "$@"
}

run_tsan_lib() {
  tsan --lib -- queue::tests streamer::
}

run_tsan_stress() {
  SMOE_STRESS_OPS=$STRESS_OPS tsan --test alone -- stress:: --nocapture
}

run_tsan_streamer() {
  tsan --test library -- streamer::
}

part install install
if [ "$FAILED" -eq 0 ]; then
  for name in "${ALL_PARTS[@]}"; do
    if selected "$name"; then
      part "$name" "run_${name//-/_}"
    fi
  done
fi

echo
echo "=== sanitizers summary (toolchain $TOOLCHAIN, SMOE_STRESS_OPS=$STRESS_OPS, SMOE_MIRI_SEEDS=$MIRI_SEEDS)"
printf '%s\n' "${SUMMARY[@]}"
echo "total          $(($(date +%s) - START))s"
if [ "$FAILED" -ne 0 ]; then
  echo "FAILED"
  exit 1
fi
echo "all passed"
