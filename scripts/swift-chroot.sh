#!/usr/bin/env bash
# Builds and tests smoe's Swift package (Package.swift at the root) through
# the example package examples-swift/, in a Debian 13 (trixie) chroot,
# linking the library built on this host and installed with
# scripts/install.sh.
#
# Usage: scripts/swift-chroot.sh [setup|all]     (as root, from anywhere)
#
#   setup   only create (or reuse) the cached chroot
#   all     (default) setup, then:
#             cargo build --release, install.sh      on the host, into a prefix
#                                                    in the chroot
#             smoe synth                             a small vault, on the host
#             swift build / swift test               in the chroot: examples-swift
#                                                    depends on the root package
#                                                    by path, which finds the
#                                                    library with pkg-config
#                                                    (dynamic link)
#             the example executable on the vault    in the chroot (static link)
#             a package depending on smoe by URL     (file://, a git snapshot of
#                                                    the working tree)
#             `import CSMoE` from the prefix's module map, with swiftc
#
# Why a chroot: Debian 12 packages no Swift toolchain; Debian 13 ships
# `swiftlang` (6.0.3). Trixie's glibc (2.41) is newer than bookworm's (2.36),
# so the library and the `smoe` tool built on the host run inside the chroot
# (the reverse would not). The chroot is made once with
# `debootstrap --variant=minbase trixie` plus `apt-get install
# --no-install-recommends swiftlang libc6-dev` (~3.2 GB) and cached OUTSIDE
# the repository; later runs reuse it. A marker file records the package list
# it was completed with, another that debootstrap finished: a partial chroot
# (an interrupted first run) is removed and made again, a changed package
# list is installed.
#
# During the build the repository is bind-mounted read-only at its own path
# inside the chroot (so absolute paths are the same on both sides), /proc is
# mounted and /dev bind-mounted; a trap unmounts all three on any exit. The
# Swift build directory lives in the chroot (/var/tmp/smoe-swift-build), so
# nothing is written into the repository.
#
# Environment:
#   SMOE_SWIFT_CHROOT   the cached chroot (default /var/cache/smoe-swift-chroot)
#   SMOE_DEBIAN_MIRROR  Debian mirror for debootstrap (default: the
#                       deb.debian.org-style URI in /etc/apt/sources.list*,
#                       else http://deb.debian.org/debian)
#
# Installs on the host: debootstrap (apt-get), if missing. Needs root (chroot,
# mount), network to the Debian mirror on the first run, ~3.5 GB of disk.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$(pwd -P)
if [ -d "$HOME/.cargo/bin" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
export DEBIAN_FRONTEND=noninteractive

MODE=${1:-all}
case "$MODE" in
  setup | all) ;;
  *)
    echo "usage: $0 [setup|all]" >&2
    exit 2
    ;;
esac

CHROOT=${SMOE_SWIFT_CHROOT:-/var/cache/smoe-swift-chroot}
SUITE=trixie
# Everything the build needs in the chroot. swiftlang pulls in its clang and
# linker; libc6-dev is only a recommendation of it, but linking needs crt1.o.
# git: SwiftPM clones a dependency given by URL with it.
CHROOT_PACKAGES=(swiftlang libc6-dev git)
# Markers: debootstrap finished; the packages below are installed.
DEBOOTSTRAPPED="$CHROOT/.smoe-debootstrap-done"
READY="$CHROOT/.smoe-swift-ready"
# Paths inside the chroot.
BUILD_DIR=/var/tmp/smoe-swift-build
VAULT_DIR=/var/tmp/smoe-swift-vault
# scripts/install.sh's prefix, and one holding only the static library.
PREFIX_DIR=$BUILD_DIR/prefix
STATIC_PREFIX_DIR=$BUILD_DIR/prefix-static

SCRIPT_START=$(date +%s)
TIMINGS=()

# step NAME COMMAND...: runs COMMAND, prints and records how long it took.
step() {
  local name=$1
  shift
  local start
  start=$(date +%s)
  echo
  echo "=== swift ${name}"
  "$@"
  local seconds=$(($(date +%s) - start))
  echo "=== swift ${name}: ok in ${seconds}s"
  TIMINGS+=("$(printf '%-14s %5ds' "$name" "$seconds")")
}

die() {
  echo "swift-chroot: $*" >&2
  exit 1
}

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, chroot, mount)"

# The mirror debootstrap fetches from: the Debian archive apt already uses.
debian_mirror() {
  if [ -n "${SMOE_DEBIAN_MIRROR:-}" ]; then
    echo "$SMOE_DEBIAN_MIRROR"
    return
  fi
  local uri
  uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
    /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v '^[[:space:]]*#' |
    grep -oE 'https?://[^ ]+/debian/?( |$)' | head -n 1 | tr -d ' ' || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

# Mount points under the chroot, deepest first.
chroot_mounts() {
  awk -v root="$CHROOT" '$5 == root || index($5, root "/") == 1 { print $5 }' \
    /proc/self/mountinfo | sort -r
}

unmount_all() {
  local mount_point
  for mount_point in $(chroot_mounts); do
    umount "$mount_point" 2>/dev/null || umount -l "$mount_point" ||
      echo "WARNING: could not unmount $mount_point" >&2
  done
}

# Serializes runs sharing one chroot (two CI jobs on one machine).
take_lock() {
  mkdir -p "$(dirname "$CHROOT")"
  exec 9>"$CHROOT.lock"
  timeout 1800 flock 9 || die "could not lock $CHROOT.lock within 30 min"
}

install_debootstrap() {
  if command -v debootstrap >/dev/null; then
    echo "debootstrap: $(dpkg-query -W -f='${Version}' debootstrap 2>/dev/null || echo present)"
    return
  fi
  timeout 600 apt-get update -qq </dev/null
  timeout 600 apt-get install -y -qq --no-install-recommends debootstrap </dev/null
}

mount_chroot() {
  mountpoint -q "$CHROOT/proc" || mount -t proc proc "$CHROOT/proc"
  mountpoint -q "$CHROOT/dev" || mount --bind /dev "$CHROOT/dev"
}

# in_chroot SECONDS COMMAND...: runs COMMAND in the chroot with a clean
# environment and no stdin, killed after SECONDS.
in_chroot() {
  local seconds=$1
  shift
  timeout --kill-after=30 "$seconds" chroot "$CHROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    DEBIAN_FRONTEND=noninteractive "$@" </dev/null
}

create_chroot() {
  if [ -f "$READY" ] && [ "$(cat "$READY")" = "${CHROOT_PACKAGES[*]}" ]; then
    echo "reusing $CHROOT ($(du -sh --one-file-system "$CHROOT" | cut -f1))"
    return
  fi
  if [ -d "$CHROOT" ] && [ ! -f "$DEBOOTSTRAPPED" ] && [ ! -f "$READY" ]; then
    # An interrupted or failed debootstrap: start over.
    unmount_all
    [ -z "$(chroot_mounts)" ] || die "mounts remain under $CHROOT; not removing it"
    echo "removing the incomplete chroot $CHROOT"
    rm -rf --one-file-system "$CHROOT"
  fi
  if [ ! -d "$CHROOT" ]; then
    local mirror
    mirror=$(debian_mirror)
    echo "debootstrap --variant=minbase $SUITE $CHROOT $mirror"
    timeout 1200 debootstrap --variant=minbase "$SUITE" "$CHROOT" "$mirror" </dev/null ||
      die "debootstrap failed (see $CHROOT/debootstrap/debootstrap.log)"
    touch "$DEBOOTSTRAPPED"
  fi
  cp /etc/resolv.conf "$CHROOT/etc/resolv.conf"
  mount_chroot
  in_chroot 600 apt-get update -qq
  in_chroot 1800 apt-get install -y -qq --no-install-recommends "${CHROOT_PACKAGES[@]}"
  in_chroot 300 apt-get clean
  echo "${CHROOT_PACKAGES[*]}" >"$READY"
  echo "chroot ready: $(du -sh --one-file-system "$CHROOT" | cut -f1)"
}

show_versions() {
  in_chroot 60 swift --version 2>&1 | sed -n 1,2p
  in_chroot 60 ldd --version | sed -n 1p
}

build_host() {
  cargo build --release
  ls -l target/release/libsmoe.a target/release/libsmoe.so target/release/smoe
}

# scripts/install.sh into the chroot: the prefix every Swift build uses, and
# a copy whose lib/ holds only libsmoe.a (a linker takes the shared library
# when both are there).
install_prefix() {
  rm -rf "${CHROOT:?}$PREFIX_DIR" "${CHROOT:?}$STATIC_PREFIX_DIR"
  SMOE_SKIP_BUILD=1 bash scripts/install.sh "$CHROOT$PREFIX_DIR"
  SMOE_SKIP_BUILD=1 bash scripts/install.sh "$CHROOT$STATIC_PREFIX_DIR" >/dev/null
  rm "$CHROOT$STATIC_PREFIX_DIR"/lib/libsmoe.so*
  # smoe.pc names the prefix as the host sees it; inside the chroot it is
  # the path without $CHROOT.
  sed -i "s|^prefix=.*|prefix=$PREFIX_DIR|" "$CHROOT$PREFIX_DIR/lib/pkgconfig/smoe.pc"
  sed -i "s|^prefix=.*|prefix=$STATIC_PREFIX_DIR|" "$CHROOT$STATIC_PREFIX_DIR/lib/pkgconfig/smoe.pc"
}

# Bind-mounts the repository read-only at its own path inside the chroot.
mount_repo() {
  mkdir -p "$CHROOT$REPO"
  if ! mountpoint -q "$CHROOT$REPO"; then
    mount --bind "$REPO" "$CHROOT$REPO"
    mount -o remount,bind,ro "$CHROOT$REPO"
  fi
}

make_vault() {
  rm -rf "${CHROOT:?}$VAULT_DIR"
  target/release/smoe synth "$CHROOT$VAULT_DIR" --layers 4 --experts 16 --blob-kib 64
}

# in_prefix PREFIX SECONDS COMMAND...: in_chroot with PREFIX's smoe.pc on
# pkg-config's path and its library on the loader's.
in_prefix() {
  local prefix=$1
  shift
  local seconds=$1
  shift
  in_chroot "$seconds" env PKG_CONFIG_PATH="$prefix/lib/pkgconfig" \
    LD_LIBRARY_PATH="$prefix/lib" "$@"
}

swift_build() {
  in_prefix "$PREFIX_DIR" 1200 swift build --package-path "$REPO/examples-swift" \
    --scratch-path "$BUILD_DIR/dynamic"
}

swift_test() {
  in_prefix "$PREFIX_DIR" 900 env SMOE_BIN="$REPO/target/release/smoe" \
    swift test --package-path "$REPO/examples-swift" --scratch-path "$BUILD_DIR/dynamic"
}

# The executable again, linked statically against the prefix that holds
# only libsmoe.a.
run_example() {
  # SwiftPM does not track libsmoe.a as an input: remove the executable so
  # it is linked again with the library just built.
  rm -f "$CHROOT$BUILD_DIR/static/debug/smoe-swift-stream"
  in_prefix "$STATIC_PREFIX_DIR" 1200 env SMOE_LINK=static \
    swift build --package-path "$REPO/examples-swift" \
    --scratch-path "$BUILD_DIR/static" --product smoe-swift-stream
  local exe=$BUILD_DIR/static/debug/smoe-swift-stream
  if in_chroot 60 ldd "$exe" | grep -q libsmoe; then
    die "$exe is linked to libsmoe.so, not the static library"
  fi
  in_chroot 300 "$exe" "$VAULT_DIR"
}

# A package that depends on smoe by URL, as a user's would: SwiftPM clones
# the repository with git and refuses a dependency with unsafe flags. The
# URL is a file:// git repository of this working tree's files (a commit of
# its own, so uncommitted changes are tested too).
check_by_url() {
  local snapshot=$BUILD_DIR/url/smoe
  local work=$BUILD_DIR/url/app
  rm -rf "${CHROOT:?}$BUILD_DIR/url"
  mkdir -p "$CHROOT$snapshot" "$CHROOT$work/Sources/app"
  git ls-files -z --cached --others --exclude-standard |
    xargs -0 cp --parents -t "$CHROOT$snapshot" 2>/dev/null || true
  git -C "$CHROOT$snapshot" init -q -b main
  git -C "$CHROOT$snapshot" add -A
  git -C "$CHROOT$snapshot" -c user.name=smoe -c user.email=smoe@localhost \
    commit -q -m snapshot
  cat >"$CHROOT$work/Package.swift" <<SWIFT
// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "app",
    dependencies: [.package(url: "file://$snapshot", branch: "main")],
    targets: [
        .executableTarget(name: "app", dependencies: [.product(name: "SMoE", package: "smoe")]),
    ]
)
SWIFT
  cat >"$CHROOT$work/Sources/app/main.swift" <<'SWIFT'
import SMoE

let streamer = try Streamer(vault: CommandLine.arguments[1])
guard let claim = try streamer.claim(layer: 1, expert: 3, timeoutNanoseconds: 10_000_000_000) else {
    fatalError("no claim")
}
print("by URL: smoe \(Streamer.version), layer 1 expert 3: \(claim.size) bytes")
try claim.release()
SWIFT
  in_prefix "$PREFIX_DIR" 1200 swift build --package-path "$work" --scratch-path "$work/.build"
  in_prefix "$PREFIX_DIR" 60 "$work/.build/debug/app" "$VAULT_DIR"
}

# `import CSMoE` from the installed prefix: Clang finds
# PREFIX/include/smoe/module.modulemap through the include path, and its
# `link "smoe"` links the library; only -I, -L and the rpath are given.
check_installed() {
  local prefix=$PREFIX_DIR
  local work=$BUILD_DIR/installed
  rm -rf "${CHROOT:?}$work"
  mkdir -p "$CHROOT$work"
  cat >"$CHROOT$work/main.swift" <<'SWIFT'
import CSMoE

var streamer: OpaquePointer?
guard smoe_open(CommandLine.arguments[1], nil, &streamer) == SMOE_OK, let streamer else {
    fatalError(String(cString: smoe_last_error()))
}
var slot = smoe_slot()
precondition(smoe_claim_wait(streamer, 1, 2, 10_000_000_000, &slot) == SMOE_OK)
print("installed CSMoE: smoe \(String(cString: smoe_version())), ABI \(smoe_abi_version()), layer 1 expert 2: \(slot.size) bytes in slot \(slot.slot_index)")
precondition(smoe_release(streamer, &slot) == SMOE_OK)
smoe_close(streamer)
SWIFT
  in_chroot 600 swiftc -Xcc -I"$prefix/include/smoe" -L"$prefix/lib" \
    -Xlinker -rpath -Xlinker "$prefix/lib" "$work/main.swift" -o "$work/installed-check"
  in_chroot 60 "$work/installed-check" "$VAULT_DIR"
}

take_lock
trap unmount_all EXIT
# Signals end the script through `exit`, so the EXIT trap unmounts.
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
step debootstrap install_debootstrap
step chroot create_chroot
mount_chroot
step versions show_versions
if [ "$MODE" = all ]; then
  step host-build build_host
  step install install_prefix
  mount_repo
  step vault make_vault
  step build swift_build
  step test swift_test
  step example run_example
  step by-url check_by_url
  step installed check_installed
fi

echo
echo "=== swift timings"
printf '%s\n' "${TIMINGS[@]}"
echo "total          $(($(date +%s) - SCRIPT_START))s"
