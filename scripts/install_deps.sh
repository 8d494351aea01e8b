#!/usr/bin/env bash
# Installs every build and test dependency of duet on Debian 12 by package name.
# Idempotent: when everything is present it only checks (no apt-get update).
#   scripts/install_deps.sh
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache git python3
  libabsl-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libucx-dev ucx-utils
  clang clang-format libclang-rt-14-dev
  libopenblas-dev nlohmann-json3-dev libcpp-httplib-dev libboost1.81-dev libxxhash-dev
  iproute2 curl python3-venv
  etcd-server etcd-client
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
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install_deps: done"
