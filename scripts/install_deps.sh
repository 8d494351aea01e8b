#!/usr/bin/env bash
# Installs every build and test dependency of duet on Debian 12 by package name, then fetches
# the one source dependency Debian lacks: xgrammar's pinned source release (the grammar engine of
# common/grammar/), checked against its sha256 and unpacked into third_party/ (gitignored).
# Idempotent: when everything is present it only checks (no apt-get update, no download).
#   scripts/install_deps.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache git python3 patch
  libabsl-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libucx-dev ucx-utils
  clang clang-format libclang-rt-14-dev
  libopenblas-dev nlohmann-json3-dev libcpp-httplib-dev libboost1.81-dev libxxhash-dev
  iproute2 curl python3-venv python3-pip
  openssl libssl-dev
  etcd-server etcd-client
  prometheus haproxy
  libgtest-dev libgmock-dev libbenchmark-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
else
  echo "install_deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  echo "install_deps: done"
fi

# xgrammar's source release from PyPI (the sdist holds the C++ core, its headers and the
# header-only third-party code it needs); CMake's DUET_XGRAMMAR_SOURCE_DIR points here.
XGRAMMAR_VERSION="0.2.8"
XGRAMMAR_SHA256="8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80"
XGRAMMAR_DIR="$ROOT/third_party/xgrammar-$XGRAMMAR_VERSION"
XGRAMMAR_PATCHES=("$ROOT"/scripts/patches/xgrammar-"$XGRAMMAR_VERSION"-*.patch)
# The release's hash and the patches': a tree unpacked before a patch changed is unpacked again.
XGRAMMAR_STAMP="$XGRAMMAR_SHA256 $(cat "${XGRAMMAR_PATCHES[@]}" | sha256sum | cut -d' ' -f1)"
fetch_xgrammar() {
  echo "install_deps: fetching xgrammar $XGRAMMAR_VERSION (source release, ~2.7 MB)"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary xgrammar \
    "xgrammar==$XGRAMMAR_VERSION" -d "$tmp"
  local tarball="$tmp/xgrammar-$XGRAMMAR_VERSION.tar.gz"
  echo "$XGRAMMAR_SHA256  $tarball" | sha256sum --check --quiet -
  mkdir -p "$tmp/src"
  tar -xzf "$tarball" -C "$tmp/src" --strip-components=1
  # duet's fixes to the pinned release (scripts/patches/xgrammar-<version>-*.patch, each saying
  # what it fixes), applied in name order.
  for p in "${XGRAMMAR_PATCHES[@]}"; do
    patch --quiet --directory="$tmp/src" -p1 <"$p"
  done
  echo "$XGRAMMAR_STAMP" >"$tmp/src/.duet-sha256"
  mkdir -p "$ROOT/third_party"
  rm -rf "$XGRAMMAR_DIR"
  mv "$tmp/src" "$XGRAMMAR_DIR"
  echo "install_deps: xgrammar $XGRAMMAR_VERSION unpacked into $XGRAMMAR_DIR"
}
if [ "$(cat "$XGRAMMAR_DIR/.duet-sha256" 2>/dev/null)" = "$XGRAMMAR_STAMP" ]; then
  echo "install_deps: xgrammar $XGRAMMAR_VERSION present in $XGRAMMAR_DIR"
else
  fetch_xgrammar
fi
