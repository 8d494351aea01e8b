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
  MODEL="$GGUF"
  echo "== duet generate, one process ($(basename "$GGUF"), greedy) =="
  "$BUILD/cli/duet" generate --model "$GGUF" --chat \
    --prompt "Write one sentence about the sea." --max-tokens 40
else
  echo "demo: could not fetch the SmolLM2 model (scripts/get_model.sh smollm2 failed);" \
    "falling back to the tiny synthetic model (random weights: its text is not meaningful)" >&2
  MODEL="$ROOT/models/tiny"
  if [ ! -f "$MODEL/config.json" ]; then
    "$BUILD/cli/duet-make-model" --preset tiny --seed 1 --out "$MODEL"
  fi
fi

# The disaggregated cluster on this machine: coordinator + 1 prefill + 1 decode node, KV
# streamed layer by layer over UCX shared memory.
echo "== duet serve --loopback (1 prefill, 1 decode, KV over UCX shm) =="
LOG="$(mktemp)"
"$BUILD/cli/duet" serve --loopback --prefill 1 --decode 1 --model "$MODEL" --transport shm \
  > "$LOG" 2>&1 &
SERVE=$!
trap 'kill "$SERVE" 2>/dev/null || true; wait "$SERVE" 2>/dev/null || true; rm -f "$LOG"' EXIT
ADDR=""
for _ in $(seq 1 600); do
  ADDR="$(awk '/^ready /{print $2}' "$LOG")"
  [ -n "$ADDR" ] && break
  if ! kill -0 "$SERVE" 2>/dev/null; then cat "$LOG" >&2; echo "demo: the cluster failed" >&2; exit 1; fi
  sleep 0.2
done
[ -n "$ADDR" ] || { cat "$LOG" >&2; echo "demo: the cluster did not become ready" >&2; exit 1; }
echo "cluster ready at $ADDR"
for PROMPT in "The three primary colors are" "The capital of France is" "Once upon a time"; do
  "$BUILD/cli/duet" generate --server "$ADDR" --prompt "$PROMPT" --max-tokens 24 --json |
    python3 -c '
import json, sys
r = json.load(sys.stdin)
t = r["timings"]
print("prompt: %r" % sys.argv[1])
print("  text: %r" % r["text"])
print("  TTFT %.1f ms (server: prefill %.1f ms, queue %.1f ms); exposed KV transfer tail (forward pass done on P -> ready on D) %.2f ms"
      % (r["timings"]["ttft_ms"], t["server_prefill_compute_us"] / 1e3, t["server_queue_us"] / 1e3,
         t["server_transfer_tail_us"] / 1e3))
lt = t["layer_transfer_us"]
if lt:
    print("  per-layer transfer (layer computed -> landed on decode), ms: " +
          " ".join("%.2f" % (x / 1e3) for x in lt))
' "$PROMPT"
done
