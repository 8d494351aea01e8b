#!/usr/bin/env bash
# Configures (once) and builds duet into build/ with Ninja.
#   scripts/build.sh [ninja targets...]
#   DUET_DEBUG_INFO=lines scripts/build.sh   # line tables only (-g1): a quicker first build (CI)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${DUET_BUILD_DIR:-$ROOT/build}"
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DDUET_DEBUG_INFO="${DUET_DEBUG_INFO:-full}"
fi
JOBS="${DUET_JOBS:-$(nproc)}"
cmake --build "$BUILD" -j "$JOBS" ${@:+--target "$@"}
