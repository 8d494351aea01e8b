#!/usr/bin/env bash
# Configures (once) and builds duet into build/ with Ninja.
#   scripts/build.sh [ninja targets...]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${DUET_BUILD_DIR:-$ROOT/build}"
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
JOBS="${DUET_JOBS:-$(nproc)}"
cmake --build "$BUILD" -j "$JOBS" ${@:+--target "$@"}
