#!/usr/bin/env bash
# Installs smoe's C library, headers, Swift module map, pkg-config file and
# CMake package.
#
#   scripts/install.sh PREFIX
#
# writes
#   PREFIX/lib/libsmoe.a
#   PREFIX/lib/libsmoe.so.1       the shared library, SONAME libsmoe.so.1 (1 is
#                                 SMOE_ABI_VERSION; build.rs gives the linker
#                                 the name), and the link
#   PREFIX/lib/libsmoe.so         -> libsmoe.so.1, which -lsmoe finds
#                                 (macOS: libsmoe.1.dylib, install name
#                                 @rpath/libsmoe.1.dylib, and libsmoe.dylib)
#   PREFIX/include/smoe.h, smoe.hpp
#   PREFIX/include/smoe/module.modulemap
#                                 the Clang module CSMoE, for Swift, in a
#                                 folder of its own: loose in a shared include
#                                 folder it would collide with other packages'
#                                 module maps and with a SwiftPM package's
#   PREFIX/lib/pkgconfig/smoe.pc
#   PREFIX/lib/cmake/smoe/smoeConfig.cmake, smoeConfigVersion.cmake
#                                 find_package(smoe CONFIG): smoe::smoe (static)
#                                 and smoe::smoe_shared (from cmake/*.in)
#
# The CMake package finds the tree relative to itself, so the tree can be
# moved; smoe.pc names PREFIX, each space in it escaped with a backslash, as
# pkg-config reads a value (pkg-config and pkgconf print it escaped again,
# `-I/opt/my\ tools/include`, which make, a shell's eval, CMake's
# FindPkgConfig and SwiftPM read back as one argument). A PREFIX with a
# character smoe.pc cannot carry that way (a quote, a backslash, `$`, `#`,
# a parenthesis, a control character, ...) is refused before anything is
# written.
#
# It runs `cargo build --release` first. Environment:
#   SMOE_SKIP_BUILD=1        do not run cargo; install what SMOE_LIB_DIR holds
#   SMOE_LIB_DIR=DIR         where libsmoe.a and the shared library are
#                            (default: target/release)
#   SMOE_NATIVE_STATIC_LIBS  Libs.private of smoe.pc and what smoe::smoe links
#                            after libsmoe.a (default: what `cargo rustc
#                            --release --lib --crate-type staticlib --
#                            --print native-static-libs` prints on this OS;
#                            tests/library/examples.rs checks the Linux list)
set -euo pipefail
# `cd DIR` would search CDPATH and print where it went, into $(...).
unset CDPATH

if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 PREFIX" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# What smoe.pc can name: letters, digits, / . _ - + , @ : = % ~, spaces
# (escaped there) and any non-ASCII byte; checked on the absolute path, the
# current directory included.
case $1 in
  /*) WANTED=$1 ;;
  *) WANTED=$PWD/$1 ;;
esac
UNSAFE=$(printf '%s' "$WANTED" | LC_ALL=C tr -d 'A-Za-z0-9/._+,@:=%~ \200-\377-')
if [ -n "$UNSAFE" ]; then
  # shown TEXT: TEXT, or bash's quoting of it where it holds a control
  # character (a tab, a newline).
  shown() {
    case $1 in
      *[[:cntrl:]]*) printf '%q' "$1" ;;
      *) printf '%s' "$1" ;;
    esac
  }
  echo "$0: PREFIX \"$(shown "$WANTED")\" holds $(shown "$UNSAFE"): smoe.pc cannot name such a" \
    "path (pkg-config would split or expand it); use letters, digits, spaces, non-ASCII" \
    "letters and / . _ - + , @ : = % ~" >&2
  exit 2
fi
# pkg-config drops a value's trailing blank, escaped or not: the prefix's
# last name must not end with a space. The path is resolved by its names
# first (`.`, `..` and empty names), as `cd` then `pwd` will.
TAIL=
IFS=/ read -r -a NAMES <<<"$WANTED"
for NAME in "${NAMES[@]}"; do
  case $NAME in
    '' | .) ;;
    ..) TAIL=${TAIL%/*} ;;
    *) TAIL=$TAIL/$NAME ;;
  esac
done
case $TAIL in
  *' ')
    echo "$0: PREFIX \"$WANTED\" ends with a space: smoe.pc cannot name such a path" \
      "(pkg-config drops a trailing blank); remove it" >&2
    exit 2
    ;;
esac
mkdir -p "$1"
PREFIX=$(cd "$1" && pwd)
# smoe.pc's prefix: each space escaped with a backslash.
PC_PREFIX=${PREFIX// /\\ }

# The C ABI's version, which names the shared library:
# `pub const SMOE_ABI_VERSION: u32 = N;` (build.rs reads the same line).
ABI=$(sed -n 's/^pub const SMOE_ABI_VERSION: u32 = \([0-9][0-9]*\);$/\1/p' "$ROOT/src/ffi/mod.rs")
if [ -z "$ABI" ]; then
  echo "$0: no SMOE_ABI_VERSION in $ROOT/src/ffi/mod.rs" >&2
  exit 1
fi

case "$(uname -s)" in
  Darwin)
    SHARED_LIB=libsmoe.dylib
    SHARED_FILE=libsmoe.$ABI.dylib
    SONAME=@rpath/$SHARED_FILE
    DEFAULT_NATIVE_STATIC_LIBS="-lSystem -lc -lm"
    ;;
  *)
    SHARED_LIB=libsmoe.so
    SHARED_FILE=libsmoe.so.$ABI
    SONAME=$SHARED_FILE
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

install -d "$PREFIX/lib/pkgconfig" "$PREFIX/lib/cmake/smoe" "$PREFIX/include/smoe"
# -C: a file that is already the same keeps its time, so what was built
# against this prefix (scripts/llama.sh's llama.cpp) is not relinked for
# nothing.
install -C -m 644 "$LIB_DIR/libsmoe.a" "$PREFIX/lib/libsmoe.a"
# The file carries the name the linker wrote into it (the SONAME, or the
# install name), which is what a program linked against it asks the loader
# for; -lsmoe finds it through the link.
install -C -m 755 "$LIB_DIR/$SHARED_LIB" "$PREFIX/lib/$SHARED_FILE"
ln -sfn "$SHARED_FILE" "$PREFIX/lib/$SHARED_LIB"
install -C -m 644 "$ROOT/include/smoe.h" "$ROOT/include/smoe.hpp" "$PREFIX/include/"
# Earlier versions of this script put the module map loose in include/.
if [ -f "$PREFIX/include/module.modulemap" ] &&
  grep -q '^module CSMoE' "$PREFIX/include/module.modulemap"; then
  rm "$PREFIX/include/module.modulemap"
fi

cat >"$PREFIX/include/smoe/module.modulemap" <<'MODULEMAP'
module CSMoE {
    header "../smoe.h"
    link "smoe"
    export *
}
MODULEMAP

cat >"$PREFIX/lib/pkgconfig/smoe.pc" <<PC
prefix=$PC_PREFIX
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: smoe
Description: Stream Mixture-of-Experts expert weights from SSD into an aligned ring
Version: $VERSION
Libs: -L\${libdir} -lsmoe
Libs.private: $NATIVE_STATIC_LIBS
Cflags: -I\${includedir}
PC

# The CMake package: cmake/NAME.in with its @VARIABLES@ replaced (a list in
# CMake is separated by semicolons).
configure_cmake() {
  sed -e "s|@SMOE_VERSION@|$VERSION|g" \
    -e "s|@SMOE_SHARED_FILE@|$SHARED_FILE|g" \
    -e "s|@SMOE_SONAME@|$SONAME|g" \
    -e "s|@SMOE_NATIVE_STATIC_LIBS@|${NATIVE_STATIC_LIBS// /;}|g" \
    "$ROOT/cmake/$1.in" >"$PREFIX/lib/cmake/smoe/$1"
}
configure_cmake smoeConfig.cmake
configure_cmake smoeConfigVersion.cmake

echo "installed smoe $VERSION into $PREFIX"
