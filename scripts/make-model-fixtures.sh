#!/usr/bin/env bash
# Regenerate tests/fixtures/models/ from other people's writers:
#   transformers save_pretrained (safetensors), llama.cpp's convert_hf_to_gguf.py
#   and llama-quantize (GGUF), the gguf Python package (synthetic GGUF).
#
# NOT run by CI: CI uses the committed files and never installs torch.
# Needs: python3 (3.10+) with venv, a C/C++ compiler (for llama-quantize and
# llama-simple), network access to PyPI, about 6 GB of disk for the venv.
#
# Environment:
#   SMOE_FIXTURE_VENV   the virtual environment (default /var/cache/smoe-fixtures-venv),
#                       created if missing
#   SMOE_FIXTURE_CACHE  sdist, llama.cpp build and work files (default /var/cache/smoe-fixtures)
#   SMOE_FIXTURE_LLAMA_BUILD=0  skip building llama-quantize/llama-simple: the
#                       Q4_K_M fixture and the llama-simple results are then left out
#   JOBS                parallel build jobs (default: nproc)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SMOE_FIXTURE_VENV:-/var/cache/smoe-fixtures-venv}"
CACHE="${SMOE_FIXTURE_CACHE:-/var/cache/smoe-fixtures}"
OUT="$ROOT/tests/fixtures/models"
JOBS="${JOBS:-$(nproc)}"

LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# exact versions the committed fixtures were made with
PY_PACKAGES=(
  torch==2.15.0 transformers==5.24.0 safetensors==0.8.0 sentencepiece==0.2.3
  gguf==0.19.0 numpy==2.4.6 protobuf==7.36.2 cmake==4.4.5 ninja==1.13.2
)

say() { printf '[make-model-fixtures] %s\n' "$*"; }

# 1. the virtual environment (torch from PyPI pulls its CUDA wheels: ~5.6 GB)
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --upgrade pip
fi
if ! "$VENV/bin/python" - "${PY_PACKAGES[@]}" <<'EOF'
import sys
from importlib.metadata import version, PackageNotFoundError
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        sys.exit(1)
    if have != want:
        sys.exit(1)
EOF
then
  say "installing ${PY_PACKAGES[*]}"
  "$VENV/bin/pip" install "${PY_PACKAGES[@]}"
fi

# 2. llama.cpp's converter from the llama-cpp-python source distribution.
#    (--no-binary for this package only: with ':all:' pip would build the cmake
#    build dependency from source just to read the sdist's metadata.)
mkdir -p "$CACHE"
SDIST="$CACHE/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  say "downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (sdist)"
  "$VENV/bin/pip" download --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$CACHE"
fi
echo "$LLAMA_CPP_PYTHON_SHA256  $SDIST" | sha256sum -c --quiet
SRC="$CACHE/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
if [ ! -f "$SRC/vendor/llama.cpp/convert_hf_to_gguf.py" ]; then
  tar -xzf "$SDIST" -C "$CACHE"
fi
LLAMA_SRC="$SRC/vendor/llama.cpp"

# 3. llama-quantize (K-quants) and llama-simple (does llama.cpp run the files?)
BUILD_ARGS=()
if [ "${SMOE_FIXTURE_LLAMA_BUILD:-1}" != 0 ]; then
  BUILD="$CACHE/llama-build"
  if [ ! -x "$BUILD/bin/llama-quantize" ] || [ ! -x "$BUILD/bin/llama-simple" ]; then
    say "building llama-quantize and llama-simple (several minutes)"
    PATH="$VENV/bin:$PATH" cmake -S "$LLAMA_SRC" -B "$BUILD" -G Ninja \
      -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=OFF
    PATH="$VENV/bin:$PATH" cmake --build "$BUILD" --target llama-quantize llama-simple -j "$JOBS"
  fi
  BUILD_ARGS=(--llama-build "$BUILD")
else
  say "SMOE_FIXTURE_LLAMA_BUILD=0: no Q4_K_M fixture, no llama-simple check"
fi

# 4. everything else, deterministically (seeded), into tests/fixtures/models/
WORK="$CACHE/work"
rm -rf "$WORK"
SMOE_LLAMA_CPP_PYTHON_VERSION="$LLAMA_CPP_PYTHON_VERSION" \
SMOE_LLAMA_CPP_PYTHON_SHA256="$LLAMA_CPP_PYTHON_SHA256" \
PYTHONHASHSEED=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
  "$VENV/bin/python" "$ROOT/scripts/make-model-fixtures.py" \
    --out "$OUT" --work "$WORK" --llama-src "$LLAMA_SRC" "${BUILD_ARGS[@]}"

say "done: $(du -sh "$OUT" | cut -f1) in $OUT"
(cd "$OUT" && find . -type f ! -name README.md | sort | xargs sha256sum)
