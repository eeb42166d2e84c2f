#!/usr/bin/env bash
# The CUDA host's figures (issue 25; docs/c-api.md "CUDA hosts",
# docs/performance.md "Into a GPU"), on a Linux machine with an NVIDIA GPU,
# nvcc and root, from a clean clone:
#
#   scripts/cuda.sh [STEP...]      STEP: ffn register stream llama, or all
#                                  (default: ffn register stream)
#
#   ffn       packs Q8_0, F16 and BF16 fixtures (and a fused gate_up one),
#             computes every expert on the CPU (examples-c/expert_ffn) and on
#             the GPU from the registered ring, zero-copy and through a VRAM
#             cache; fails when they differ by more than 1e-3 (relative)
#   register  what cudaHostRegister does to a lazy ring (time, RSS, pins), with
#             populate off and on; MADV_DONTNEED on registered memory; the
#             elastic ring squeezed in a memory cgroup, registered and not
#   stream    a vault streamed through the ring into the GPU, from tmpfs and
#             from the disk, against the read limit of each (16 threads) and
#             the pinned host-to-device copy limit; from tmpfs in
#             STREAM_ROUNDS rounds (default 3), each measuring the read limit
#             beside its copy and zero-copy streams, with their ratios
#   llama     llama.cpp's CUDA build with smoe (-ngl 99, SMOE_VAULT) against
#             stock --cpu-moe: scripts/llama.sh build --cuda, then the run
#
# Environment:
#   SMOE_LIB_DIR, SMOE_BIN  a built libsmoe.a (directory) and smoe tool; when
#                           unset, `cargo build --release` makes them
#   NVCC, CUDA_ARCH         passed to examples-cuda/Makefile
#   SMOE_CUDA_DIR           scratch on the disk (default target/cuda)
#   SHM                     scratch on tmpfs (default /dev/shm/smoe-cuda)
#   STREAM_GIB              the streamed vault's size (default 8), in 4 MiB
#                           experts
#   REGISTER_GIB            the registered ring's size (default 8)
#   SMOE_LLAMA_DIR, SMOE_LLAMA_SRC, JOBS   for the llama step (scripts/llama.sh)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${SMOE_CUDA_DIR:-$ROOT/target/cuda}"
SHM="${SHM:-/dev/shm/smoe-cuda}"
STREAM_GIB="${STREAM_GIB:-8}"
REGISTER_GIB="${REGISTER_GIB:-8}"

say() { printf '[cuda.sh] %s\n' "$*" >&2; }
die() {
  say "error: $*"
  exit 1
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(ffn register stream)
[ "${steps[*]}" = all ] && steps=(ffn register stream llama)
for s in "${steps[@]}"; do
  case "$s" in ffn | register | stream | llama) ;; *) die "unknown step $s (ffn register stream llama all)" ;; esac
done

command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this needs an NVIDIA GPU"
mkdir -p "$WORK" "$SHM"

if [ -z "${SMOE_LIB_DIR:-}" ]; then
  say "cargo build --release"
  (cd "$ROOT" && cargo build --release)
  SMOE_LIB_DIR="$ROOT/target/release"
fi
SMOE_BIN="${SMOE_BIN:-$SMOE_LIB_DIR/smoe}"
[ -f "$SMOE_LIB_DIR/libsmoe.a" ] || die "no libsmoe.a in $SMOE_LIB_DIR"
[ -x "$SMOE_BIN" ] || die "no smoe tool at $SMOE_BIN"

nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader | sed 's/^/gpu: /'
say "building examples-cuda"
make -s -C "$ROOT/examples-cuda" BUILD="$WORK/bin" SMOE_LIB_DIR="$SMOE_LIB_DIR" ${NVCC:+NVCC="$NVCC"} \
  ${CUDA_ARCH:+CUDA_ARCH="$CUDA_ARCH"}
CU="$WORK/bin/smoe-cuda"

step_ffn() {
  make -s -C "$ROOT/examples-c" SMOE_LIB_DIR="$SMOE_LIB_DIR" SMOE_BIN="$SMOE_BIN" BUILD="$WORK/c" "$WORK/c/expert_ffn"
  local fixture vault refs status=0
  for fixture in mixtral-q8_0 mixtral-f16 qwen3moe-bf16 cohere2moe-q8_0-fused; do
    vault="$WORK/ffn/$fixture"
    refs="$WORK/ffn/$fixture.ref"
    rm -rf "$vault" "$refs"
    mkdir -p "$refs"
    "$SMOE_BIN" pack "$ROOT/tests/fixtures/models/$fixture.gguf" "$vault" >/dev/null
    "$CU" input "$vault" "$refs/x.f32"
    while read -r layer expert; do
      "$WORK/c/expert_ffn" "$vault" "$layer" "$expert" "$refs/x.f32" "$refs/$layer-$expert.f32"
    done < <("$CU" experts "$vault")
    echo "ffn: $fixture.gguf"
    "$CU" ffn "$vault" "$refs/x.f32" "$refs" || status=1
  done
  return $status
}

# squeeze VAULT [--no-register]: the elastic ring in a memory cgroup of its own.
squeeze() {
  local cg=/sys/fs/cgroup/smoe-cuda-squeeze.$$
  if ! grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null || [ "$(id -u)" -ne 0 ]; then
    say "skipping the squeeze: it needs root and cgroup v2's memory controller at /sys/fs/cgroup"
    return 0
  fi
  grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory >/sys/fs/cgroup/cgroup.subtree_control
  mkdir "$cg"
  echo 0 >"$cg/memory.swap.max" 2>/dev/null || true
  local status=0
  bash -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' _ "$cg" "$CU" squeeze "$@" || status=$?
  rmdir "$cg" 2>/dev/null || true
  return $status
}

step_register() {
  local vault="$SHM/register"
  rm -rf "$vault"
  "$SMOE_BIN" synth "$vault" --layers 1 --experts 64 --blob-kib 64 >/dev/null
  local slot_mb=$((REGISTER_GIB * 1024 / 64))
  "$CU" register "$vault" --slots 64 --slot-mb "$slot_mb" --populate 0
  "$CU" register "$vault" --slots 64 --slot-mb "$slot_mb" --populate 1 --wait-populate
  "$CU" register "$vault" --slots 64 --slot-mb "$slot_mb" --pinned --elastic 1 --wait-populate
  "$CU" dontneed --mib 1024
  vault="$SHM/squeeze"
  rm -rf "$vault"
  "$SMOE_BIN" synth "$vault" --layers 1 --experts 64 --blob-kib 32768 >/dev/null
  squeeze "$vault" --slots 32 --slot-mb 32 --no-register
  squeeze "$vault" --slots 32 --slot-mb 32
  squeeze "$vault" --slots 32 --slot-mb 32 --pinned
  rm -rf "$SHM/register" "$SHM/squeeze"
}

drop_caches() {
  sync
  echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || say "cannot drop the page cache (not root?)"
}

step_stream() {
  [ "$(stat -f -c %T "$SHM")" = tmpfs ] || die "$SHM is not on tmpfs"
  [ "$(stat -f -c %T "$WORK")" != tmpfs ] || die "$WORK is on tmpfs; set SMOE_CUDA_DIR to a directory on the disk"
  local shm="$SHM/stream" disk="$WORK/stream"
  rm -rf "$shm" "$disk"
  "$SMOE_BIN" synth "$shm" --layers 8 --experts $((STREAM_GIB * 32)) --blob-kib 4096 >/dev/null
  mkdir -p "$disk"
  dd if="$shm/experts.smoe" of="$disk/experts.smoe" bs=16M oflag=direct status=none
  echo "stream: vault of $STREAM_GIB GiB, 4 MiB experts, on tmpfs ($shm) and on the disk ($disk: $(df --output=source "$disk" | tail -n 1))"
  "$CU" h2d --mib 4096 --chunk-mib 4
  # the limits: 16 threads reading 4 MiB blocks into 1 GiB, as the workers
  # read into the ring (and, for tmpfs, into a block per thread)
  "$CU" read "$shm/experts.smoe" --threads 16 --block-kib 4096 --direct --dest-mib 1024
  "$CU" read "$shm/experts.smoe" --threads 16 --block-kib 4096 --dest-mib 1024
  "$CU" read "$shm/experts.smoe" --threads 16 --block-kib 4096
  drop_caches
  "$CU" read "$disk/experts.smoe" --threads 16 --block-kib 4096 --direct --dest-mib 1024
  dd if="$disk/experts.smoe" of=/dev/null bs=16M iflag=direct 2>&1 | tail -n 1 | sed 's/^/stream: dd 16M O_DIRECT: /'
  "$CU" stream "$shm" --mode pageable --passes 2
  drop_caches
  "$CU" stream "$disk" --mode copy --passes 1
  # tmpfs, alternating: the read limit moves between runs on a shared machine,
  # so each round's streams are divided by that round's limit
  local r rows="" limit copy zero gbs='s/.* = \([0-9.]*\) GB\/s.*/\1/p'
  for ((r = 1; r <= ${STREAM_ROUNDS:-3}; r++)); do
    limit=$("$CU" read "$shm/experts.smoe" --threads 16 --block-kib 4096 --direct --dest-mib 1024 | tee >(cat >&2) | sed -n "$gbs")
    copy=$("$CU" stream "$shm" --mode copy --passes 3 | tee >(cat >&2) | sed -n "1$gbs")
    zero=$("$CU" stream "$shm" --mode zero-copy --passes 3 | tee >(cat >&2) | sed -n "1$gbs")
    rows+=$(awk -v r="$r" -v l="$limit" -v c="$copy" -v z="$zero" 'BEGIN {
      printf "| %d | %.2f | %.2f | **%.2f** | %.2f | **%.2f** |", r, l, c, (l > 0 ? c / l : 0), z, (l > 0 ? z / l : 0) }')$'\n'
  done
  echo "stream from tmpfs, GB/s (the limit: 16 threads reading 4 MiB blocks into 1 GiB, O_DIRECT, as the workers do)"
  echo
  echo "| round | read limit | copy | copy ÷ limit | zero-copy | zero-copy ÷ limit |"
  echo "| --- | --- | --- | --- | --- | --- |"
  printf '%s' "$rows"
  rm -rf "$shm" "$disk"
}

step_llama() {
  SMOE_LIB_DIR="$SMOE_LIB_DIR" CUDA_ARCH="${CUDA_ARCH:-}" bash "$ROOT/scripts/llama.sh" build --cuda >/dev/null
  SMOE_BIN="$SMOE_BIN" SMOE_CUDA_BIN="$CU" SMOE_LLAMA_CUDA_DIR="$WORK/llama" bash "$ROOT/scripts/llama-cuda.sh"
}

status=0
for s in "${steps[@]}"; do
  say "step $s"
  "step_$s" || {
    status=1
    say "step $s failed"
  }
done
exit $status
