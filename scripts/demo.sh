#!/usr/bin/env bash
# The main job: installs dependencies, builds, writes a synthetic model, and runs it.
# (From the cluster issue on, this starts a loopback cluster instead.)
#   scripts/demo.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${DUET_BUILD_DIR:-$ROOT/build}"
"$ROOT/scripts/install_deps.sh"
"$ROOT/scripts/build.sh" duet duet-make-model
MODEL="$ROOT/models/tiny"
if [ ! -f "$MODEL/config.json" ]; then
  "$BUILD/cli/duet-make-model" --preset tiny --seed 1 --out "$MODEL"
fi
echo "== duet generate (tiny synthetic model, greedy) =="
"$BUILD/cli/duet" generate --model "$MODEL" --prompt "Hello, duet" --max-tokens 24 --json
