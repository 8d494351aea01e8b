#!/usr/bin/env bash
# The main job: installs dependencies, builds, fetches the default real model (SmolLM2-135M-
# Instruct, GGUF Q4_1, via scripts/get_model.sh) and generates text with it. If the model cannot
# be fetched, it says so and runs the tiny synthetic model instead.
#   scripts/demo.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${DUET_BUILD_DIR:-$ROOT/build}"
"$ROOT/scripts/install_deps.sh"
"$ROOT/scripts/build.sh" duet duet-make-model
if GGUF="$("$ROOT/scripts/get_model.sh" smollm2)"; then
  echo "== duet generate ($(basename "$GGUF"), greedy) =="
  "$BUILD/cli/duet" generate --model "$GGUF" --prompt "The three primary colors are" \
    --max-tokens 40
  echo "== duet generate --chat ($(basename "$GGUF"), greedy) =="
  "$BUILD/cli/duet" generate --model "$GGUF" --chat \
    --prompt "Write one sentence about the sea." --max-tokens 60
  exit 0
fi
echo "demo: could not fetch the SmolLM2 model (scripts/get_model.sh smollm2 failed);" \
  "falling back to the tiny synthetic model (random weights: its text is not meaningful)" >&2
MODEL="$ROOT/models/tiny"
if [ ! -f "$MODEL/config.json" ]; then
  "$BUILD/cli/duet-make-model" --preset tiny --seed 1 --out "$MODEL"
fi
echo "== duet generate (tiny synthetic model, greedy) =="
"$BUILD/cli/duet" generate --model "$MODEL" --prompt "Hello, duet" --max-tokens 24 --json
