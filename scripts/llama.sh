#!/usr/bin/env bash
# llama.cpp with smoe (docs/llama.md): the pinned llama.cpp from the
# llama-cpp-python source distribution, with integrations/llama.cpp/ applied,
# built CPU-only into a cache outside the repository.
#
#   scripts/llama.sh build      installs smoe into $SMOE_LLAMA_DIR/smoe
#                               (scripts/install.sh), configures with
#                               -DLLAMA_SMOE=ON -Dsmoe_DIR=that prefix's CMake
#                               package, and leaves llama-simple, llama-cli,
#                               llama-server, llama-bench, llama-completion
#                               and ggml-rpc-server (GGML_RPC=ON: the tests
#                               of op offload use an RPC device for a GPU) in
#                               $SMOE_LLAMA_DIR/build/bin/
#   scripts/llama.sh build-off  the same patched tree with the option off
#                               (LLAMA_SMOE=OFF, the patch's default; smoe is
#                               neither built nor looked for), leaving
#                               $SMOE_LLAMA_DIR/build-off/bin/llama-simple:
#                               it must be stock llama.cpp
#   scripts/llama.sh path       prints the first one's path (exit 1 if it is
#                               not built)
#   scripts/llama.sh current    exit 0 if the first one is built from this
#                               checkout's patch and glue, else says why and
#                               exits 1 (the tests ask, so that they never
#                               run a build of other sources)
#   scripts/llama.sh build --cuda
#                               the first with GGML_CUDA=ON for the local
#                               GPU's architecture only (CUDA_ARCH, default:
#                               what nvidia-smi reports), FlashAttention
#                               kernels off, into $SMOE_LLAMA_DIR/build-cuda/:
#                               llama-simple, llama-completion, llama-bench
#                               (scripts/llama-cuda.sh compares it with stock)
#
# No llama.cpp source is committed here: only our patch and glue. The cache is
# reused between runs: the source tree is extracted and patched again when
# the patch changes (its hash is the cache key; the builds then recompile
# what changed), the glue is copied in when it differs, and llama-simple is
# relinked when libsmoe.a changes. Remove $SMOE_LLAMA_DIR for a build from
# scratch.
#
# Environment:
#   SMOE_LLAMA_DIR   the cache (default /var/cache/smoe-llama)
#   JOBS             parallel build jobs (default: nproc)
#   CARGO_TARGET_DIR where cargo puts libsmoe.a (default: target/ here)
#   SMOE_LIB_DIR     a directory holding a built libsmoe.a and libsmoe.so:
#                    installed as it is, cargo is not run (nor needed)
#   SMOE_LLAMA_SRC   for a machine without network: a tar (any compression
#                    tar reads) of an already patched llama.cpp/ from
#                    another cache (`tar -C $SMOE_LLAMA_DIR -cJf FILE
#                    llama.cpp`), extracted instead of the sdist; it must
#                    have been patched with this patch
#
# Needs: python3 with pip (installed with apt-get when missing and root),
# cmake >= 3.14 (likewise), a C/C++ compiler, cargo, network access to PyPI on
# the first run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${SMOE_LLAMA_DIR:-/var/cache/smoe-llama}"
JOBS="${JOBS:-$(nproc)}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac

# the same sdist as scripts/make-model-fixtures.sh
LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
INTEGRATION="$ROOT/integrations/llama.cpp"
PATCH="$INTEGRATION/llama.cpp-smoe.patch"
GLUE=(llama-smoe.h llama-smoe-impl.h llama-smoe.cpp llama-smoe-lookahead.cpp llama-smoe-offload.cpp llama-smoe-tier.cpp)

say() { printf '[llama.sh] %s\n' "$*" >&2; }
die() {
  say "error: $*"
  exit 1
}

BIN="$DIR/build/bin/llama-simple"

usage() {
  echo "usage: scripts/llama.sh build [--cuda]|build-off|path|current" >&2
  exit 2
}

# apt-get install PACKAGE... when root on Debian; otherwise say what is missing.
apt_install() {
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    die "missing $*: install it (Debian: apt-get install $*)"
  fi
  say "installing $* (apt-get)"
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get update -qq </dev/null || say "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends "$@" </dev/null ||
    die "apt-get install $* failed"
}

need_tools() {
  command -v git >/dev/null || apt_install git
  command -v cc >/dev/null && command -v c++ >/dev/null || apt_install gcc g++
  command -v cmake >/dev/null || apt_install cmake
  python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
  [ -n "${SMOE_LIB_DIR:-}" ] || command -v cargo >/dev/null || die "cargo not found (install Rust with rustup)"
}

# The sdist, downloaded with pip (no dependencies, no wheel: the source) and
# checked against its pinned sha256.
fetch_sdist() {
  local sdist="$DIR/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
  if [ ! -f "$sdist" ] || ! echo "$LLAMA_CPP_PYTHON_SHA256  $sdist" | sha256sum -c --quiet 2>/dev/null; then
    rm -f "$sdist"
    say "downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (sdist, ~77 MB)"
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$DIR" >&2 ||
      die "pip download llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION failed"
    [ -f "$sdist" ] || die "pip did not leave $sdist"
    echo "$LLAMA_CPP_PYTHON_SHA256  $sdist" | sha256sum -c --quiet ||
      die "$sdist: sha256 differs from the pinned $LLAMA_CPP_PYTHON_SHA256"
  fi
  echo "$sdist"
}

# the source tree's key: the sdist and the patch (the glue is copied in
# whenever it differs, so a change to it recompiles it alone)
cache_key() {
  (
    echo "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION $LLAMA_CPP_PYTHON_SHA256"
    cd "$INTEGRATION" && sha256sum "$(basename "$PATCH")"
  ) | sha256sum | cut -c1-16
}

# The cache is emptied and rebuilt in parts (llama.cpp/, build*/, smoe/), so
# it must be this script's: a new or empty directory, or one holding the
# marker this writes (before anything else), or the key file of a cache made
# before the marker was.
# Anything else (SMOE_LLAMA_DIR naming a llama.cpp checkout, say) is refused
# before anything in it is touched.
MARKER=.smoe-llama-cache
own_cache_dir() {
  mkdir -p "$DIR"
  if [ -f "$DIR/$MARKER" ]; then
    return 0
  fi
  # Names alone prove nothing (a llama.cpp checkout is called llama.cpp):
  # without the marker or a key, only an empty directory is taken.
  local first
  if [ ! -f "$DIR/key" ]; then
    first="$(ls -A "$DIR" | head -n 1)"
    [ -z "$first" ] ||
      die "$DIR (SMOE_LLAMA_DIR) holds $first, and this script did not make the directory (it has no $MARKER); it replaces parts of its cache (llama.cpp/, build/, smoe/): give a new or empty directory"
  fi
  echo "the cache of scripts/llama.sh (smoe): its parts are replaced when they are out of date" >"$DIR/$MARKER"
}

# The patched source tree in $DIR/llama.cpp, current with the patch and the
# glue. Takes the cache's lock for the rest of the script.
prepare_tree() {
  [ -f "$PATCH" ] || die "$PATCH is missing"
  own_cache_dir
  need_tools
  exec 9>"$DIR/.lock"
  flock 9

  local key
  key="$(cache_key)"
  if [ "$(cat "$DIR/key" 2>/dev/null || true)" != "$key" ] && [ -n "${SMOE_LLAMA_SRC:-}" ]; then
    say "extracting the patched llama.cpp of $SMOE_LLAMA_SRC (key $key)"
    rm -rf "$DIR/llama.cpp" "$DIR/key"
    tar -xf "$SMOE_LLAMA_SRC" -C "$DIR" llama.cpp || die "cannot extract llama.cpp/ from $SMOE_LLAMA_SRC"
    echo "$key" >"$DIR/key"
  fi
  if [ "$(cat "$DIR/key" 2>/dev/null || true)" != "$key" ]; then
    local sdist
    sdist="$(fetch_sdist)"
    say "extracting llama.cpp and applying $(basename "$PATCH") (key $key)"
    # the build trees are kept: tar restores the sdist's file times, so only
    # the files the patch touches (and the glue) are compiled again
    rm -rf "$DIR/llama.cpp" "$DIR/extract" "$DIR/key"
    mkdir -p "$DIR/extract"
    tar -xzf "$sdist" -C "$DIR/extract" "llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
    mv "$DIR/extract/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp" "$DIR/llama.cpp"
    rm -rf "$DIR/extract"
    # the sdist's llama.cpp/.git is a submodule pointer to a repository it lacks
    rm -f "$DIR/llama.cpp/.git"
    # (the ceiling keeps git from taking an enclosing repository's root as the base)
    (cd "$DIR/llama.cpp" && GIT_CEILING_DIRECTORIES="$DIR" git apply --whitespace=nowarn "$PATCH") ||
      die "$(basename "$PATCH") does not apply"
    echo "$key" >"$DIR/key"
  fi
  for f in "${GLUE[@]}"; do
    cmp -s "$INTEGRATION/$f" "$DIR/llama.cpp/src/$f" || cp "$INTEGRATION/$f" "$DIR/llama.cpp/src/$f"
  done
}

# configure_and_build BUILD_DIR "TARGET..." OPTION...: configures llama.cpp
# (CPU, Release, static, no CURL) into BUILD_DIR with OPTION... on top, once
# (a tree configured by another cmake or generator is made again, a
# configured one is only given OPTION... again), and builds the TARGETs, the
# first of which is printed.
configure_and_build() {
  local build=$1
  local targets=($2)
  shift 2
  local generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  local stamp
  stamp="$(cmake --version | head -n 1) ${generator[*]:-make}"
  if [ "$(cat "$build/smoe-stamp" 2>/dev/null || true)" != "$stamp" ]; then
    rm -rf "$build"
  fi
  if [ ! -f "$build/CMakeCache.txt" ]; then
    say "configuring llama.cpp in $build (CPU, Release, no CURL, $*)"
    cmake -S "$DIR/llama.cpp" -B "$build" "${generator[@]}" \
      -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF \
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=OFF \
      -DLLAMA_BUILD_SERVER=OFF "$@" >&2 ||
      die "cmake configure failed"
    echo "$stamp" >"$build/smoe-stamp"
  else
    cmake "$build" "$@" >/dev/null || die "cmake reconfigure failed"
  fi
  say "building ${targets[*]} in $build ($JOBS jobs; several minutes the first time)"
  cmake --build "$build" --target "${targets[@]}" -j "$JOBS" >&2 || die "building ${targets[*]} failed"
  local t
  for t in "${targets[@]}"; do
    [ -x "$build/bin/$t" ] || die "$build/bin/$t was not built"
  done
  say "built ${targets[*]} in $build/bin"
  echo "$build/bin/${targets[0]}"
}

# smoe installed into $DIR/smoe, from SMOE_LIB_DIR or a cargo build.
install_smoe() {
  local lib_dir="${SMOE_LIB_DIR:-}"
  if [ -z "$lib_dir" ]; then
    say "building smoe (cargo build --release -p smoe --lib)"
    (cd "$ROOT" && cargo build --release -p smoe --lib) >&2 || die "cargo build failed"
    lib_dir="$TARGET_DIR/release"
  fi
  say "installing smoe from $lib_dir into $DIR/smoe (scripts/install.sh)"
  SMOE_SKIP_BUILD=1 SMOE_LIB_DIR="$lib_dir" bash "$ROOT/scripts/install.sh" "$DIR/smoe" >&2 ||
    die "scripts/install.sh $DIR/smoe failed"
}

# The sources a build is made from, as the build's stamp holds them: the patch's
# and each glue file's sha256.
source_stamp() { (cd "$INTEGRATION" && sha256sum "$(basename "$PATCH")" "${GLUE[@]}"); }
SOURCE_STAMP=smoe-source

build() {
  prepare_tree
  install_smoe
  local bin
  bin="$(configure_and_build "$DIR/build" "llama-simple llama-cli llama-server llama-bench llama-completion llama-speculative ggml-rpc-server" \
    -DLLAMA_SMOE=ON -Dsmoe_DIR="$DIR/smoe/lib/cmake/smoe" -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DGGML_RPC=ON)"
  source_stamp >"$DIR/build/$SOURCE_STAMP"
  echo "$bin"
}

current() {
  [ -x "$BIN" ] || die "$BIN is not built: run scripts/llama.sh build"
  [ -f "$DIR/build/$SOURCE_STAMP" ] ||
    die "$DIR/build has no $SOURCE_STAMP (built before builds were stamped): run scripts/llama.sh build"
  local differ
  differ="$(source_stamp | { diff "$DIR/build/$SOURCE_STAMP" - || true; } | sed -n 's/^> [0-9a-f]*  //p' | tr '\n' ' ')"
  [ -z "$differ" ] ||
    die "$DIR/build was built from another ${differ% } than this checkout's: run scripts/llama.sh build"
}

# The CUDA build: one architecture, no FlashAttention kernels (the longest
# to compile), no NCCL, so that it builds in minutes.
build_cuda() {
  local arch="${CUDA_ARCH:-}"
  if [ -z "$arch" ]; then
    arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d .)" ||
      true
  fi
  [ -n "$arch" ] || die "no GPU architecture: set CUDA_ARCH (e.g. 90) or make nvidia-smi work"
  command -v nvcc >/dev/null || die "nvcc not found: put the CUDA toolkit's bin on PATH"
  prepare_tree
  install_smoe
  configure_and_build "$DIR/build-cuda" "llama-simple llama-completion llama-bench" \
    -DLLAMA_SMOE=ON -Dsmoe_DIR="$DIR/smoe/lib/cmake/smoe" -DLLAMA_BUILD_TOOLS=ON \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_BUILD_APP=OFF
}

# Without smoe: the option off, and find_package(smoe) disabled, so nothing of
# smoe could be picked up even from a system directory (cmake would warn that
# the project never uses that variable: that is the point).
build_off() {
  prepare_tree
  configure_and_build "$DIR/build-off" llama-simple --no-warn-unused-cli -DLLAMA_SMOE=OFF \
    -DCMAKE_DISABLE_FIND_PACKAGE_smoe=ON
}

case "${1:-} ${2:-}" in
  "build --cuda") build_cuda ;;
  "build ") build ;;
  "build-off ") build_off ;;
  "path ")
    [ -x "$BIN" ] || die "$BIN is not built: run scripts/llama.sh build"
    echo "$BIN"
    ;;
  "current ") current ;;
  *) usage ;;
esac
