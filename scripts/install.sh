#!/usr/bin/env bash
# Installs smoe's C library, headers, Swift module map and pkg-config file.
#
#   scripts/install.sh PREFIX
#
# writes
#   PREFIX/lib/libsmoe.a
#   PREFIX/lib/libsmoe.so            (Linux; macOS: libsmoe.dylib, install
#                                     name @rpath/libsmoe.dylib)
#   PREFIX/include/smoe.h, smoe.hpp, module.modulemap (module CSMoE, for Swift)
#   PREFIX/lib/pkgconfig/smoe.pc
#
# It runs `cargo build --release` first. Environment:
#   SMOE_SKIP_BUILD=1        do not run cargo; install what SMOE_LIB_DIR holds
#   SMOE_LIB_DIR=DIR         where libsmoe.a and the shared library are
#                            (default: target/release)
#   SMOE_NATIVE_STATIC_LIBS  Libs.private of smoe.pc (default: what
#                            `cargo rustc --release --lib --crate-type staticlib
#                            -- --print native-static-libs` prints on this OS;
#                            tests/examples.rs checks the Linux list)
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 PREFIX" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$1"
PREFIX=$(cd "$1" && pwd)

case "$(uname -s)" in
  Darwin)
    SHARED_LIB=libsmoe.dylib
    DEFAULT_NATIVE_STATIC_LIBS="-lSystem -lc -lm"
    ;;
  *)
    SHARED_LIB=libsmoe.so
    DEFAULT_NATIVE_STATIC_LIBS="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
    ;;
esac
NATIVE_STATIC_LIBS=${SMOE_NATIVE_STATIC_LIBS:-$DEFAULT_NATIVE_STATIC_LIBS}

if [ "${SMOE_SKIP_BUILD:-0}" != 1 ]; then
  (cd "$ROOT" && cargo build --release)
fi
LIB_DIR=${SMOE_LIB_DIR:-$ROOT/target/release}
for file in "$LIB_DIR/libsmoe.a" "$LIB_DIR/$SHARED_LIB"; do
  if [ ! -f "$file" ]; then
    echo "$0: $file not found (run cargo build --release, or set SMOE_LIB_DIR)" >&2
    exit 1
  fi
done

# The version of the [package] in Cargo.toml: the first `version = "..."`.
VERSION=$(sed -n 's/^version *= *"\([^"]*\)".*/\1/p' "$ROOT/Cargo.toml" | head -n 1)
if [ -z "$VERSION" ]; then
  echo "$0: no version in $ROOT/Cargo.toml" >&2
  exit 1
fi

install -d "$PREFIX/lib/pkgconfig" "$PREFIX/include"
install -m 644 "$LIB_DIR/libsmoe.a" "$PREFIX/lib/libsmoe.a"
install -m 755 "$LIB_DIR/$SHARED_LIB" "$PREFIX/lib/$SHARED_LIB"
if [ "$SHARED_LIB" = libsmoe.dylib ]; then
  # Never a build path as install name: programs find it through their rpath.
  install_name_tool -id @rpath/libsmoe.dylib "$PREFIX/lib/libsmoe.dylib"
fi
install -m 644 "$ROOT/include/smoe.h" "$ROOT/include/smoe.hpp" "$PREFIX/include/"

cat >"$PREFIX/include/module.modulemap" <<'EOF'
module CSMoE {
    header "smoe.h"
    link "smoe"
    export *
}
EOF

cat >"$PREFIX/lib/pkgconfig/smoe.pc" <<EOF
prefix=$PREFIX
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: smoe
Description: Stream Mixture-of-Experts expert weights from SSD into an aligned ring
Version: $VERSION
Libs: -L\${libdir} -lsmoe
Libs.private: $NATIVE_STATIC_LIBS
Cflags: -I\${includedir}
EOF

echo "installed smoe $VERSION into $PREFIX"
