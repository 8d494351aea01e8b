#!/usr/bin/env bash
# What preemption costs: the same closed-loop workload on a 1 prefill + 1 decode loopback
# cluster, side by side in one go, with a decode pool roomy enough for every request in flight
# ("roomy", 512 MiB) and one that is not ("tight", --tight_bytes, 48 MiB by default: 68 blocks of
# SmolLM2-135M's f32 KV, 720 KiB each; the decode node must preempt and the coordinator resume). Prints TTFT, inter-token gap and end-to-end percentiles,
# the requests resumed and the resumes' stall (stream stopped -> next token), and checks that no
# request failed; writes each JSON report and the table (summary.md) to --out.
#
#   scripts/bench_pressure.sh                  # ~2-3 min on 2 cores
#   options: --model PATH (default: models/smollm2-135m-instruct-q4_1.gguf if present, else the
#            synthetic smollm2-135m preset, made if missing) --out DIR --build DIR --seed N
#            --tight_bytes N (default 50331648) --requests N (default 32) --concurrency N (8)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${DUET_BUILD_DIR:-$ROOT/build}"
OUT="$ROOT/bench/results/pressure"
MODEL=""
SEED=1
TIGHT_BYTES=50331648
REQUESTS=32
CONCURRENCY=8
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --build) BUILD="$2"; shift ;;
    --seed) SEED="$2"; shift ;;
    --tight_bytes) TIGHT_BYTES="$2"; shift ;;
    --requests) REQUESTS="$2"; shift ;;
    --concurrency) CONCURRENCY="$2"; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "bench_pressure.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
DUET="$BUILD/cli/duet"
[ -x "$DUET" ] || { echo "bench_pressure.sh: $DUET not built (scripts/build.sh duet)" >&2; exit 1; }
if [ -z "$MODEL" ]; then
  if [ -f "$ROOT/models/smollm2-135m-instruct-q4_1.gguf" ]; then
    MODEL="$ROOT/models/smollm2-135m-instruct-q4_1.gguf"
  else
    MODEL="$ROOT/models/smollm2-135m-synthetic"
    [ -f "$MODEL/config.json" ] ||
      "$BUILD/cli/duet-make-model" --preset smollm2-135m --seed 1 --out "$MODEL"
  fi
fi
RAW="$OUT/raw"
mkdir -p "$RAW"
rm -f "$RAW"/*.json

SERVE_PID=""
SERVE_LOG=""
stop_server() {
  if [ -n "$SERVE_PID" ]; then
    kill "$SERVE_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SERVE_PID" 2>/dev/null || true
    wait "$SERVE_PID" 2>/dev/null || true
    SERVE_PID=""
  fi
  [ -n "$SERVE_LOG" ] && rm -f "$SERVE_LOG"
  SERVE_LOG=""
}
trap stop_server EXIT
trap 'exit 130' INT TERM

start_server() {
  SERVE_LOG="$(mktemp)"
  "$DUET" serve "$@" > "$SERVE_LOG" 2>&1 &
  SERVE_PID=$!
  ADDR=""
  for _ in $(seq 1 900); do
    ADDR="$(awk '/^ready /{print $2; exit}' "$SERVE_LOG")"
    [ -n "$ADDR" ] && return 0
    kill -0 "$SERVE_PID" 2>/dev/null || break
    sleep 0.2
  done
  cat "$SERVE_LOG" >&2
  echo "bench_pressure.sh: the server did not become ready" >&2
  return 1
}

WORKLOAD=(--workload random --input_len 96-160 --output_len 96-160 --ignore_eos
          --num_requests "$REQUESTS" --concurrency "$CONCURRENCY" --seed "$SEED"
          --warmup_requests 1 --timeout_s 300)
for arm in roomy tight; do
  bytes=536870912
  [ "$arm" = tight ] && bytes=$TIGHT_BYTES
  args="--loopback --prefill 1 --decode 1 --threads 1 --model $MODEL --kv_cache_bytes $bytes"
  echo "== $arm: serve $args"
  # shellcheck disable=SC2086
  start_server $args
  "$DUET" bench serve --server "$ADDR" "${WORKLOAD[@]}" --bench_label "$arm" \
    --bench_note "serve $args" --per_request --json_out "$RAW/$arm.json" > "$RAW/$arm.txt" ||
    echo "bench_pressure.sh: $arm: the run reported failed requests (see $RAW/$arm.txt)" >&2
  stop_server
done

python3 - "$RAW" "$OUT/summary.md" <<'EOF'
import json, os, sys
raw, out = sys.argv[1], sys.argv[2]
rows = []
ok = True
for arm in ["roomy", "tight"]:
    j = json.load(open(os.path.join(raw, arm + ".json")))
    m = j["classes"]["main"] if "classes" in j else j
    req, lat, srv = m["requests"], m["latency_ms"], m["server_ms"]
    ok = ok and req["failed"] == 0
    def p(d, k): return d.get(k, float("nan"))
    rows.append([arm, req["completed"], req["failed"], req.get("resumed", 0), req.get("resumes", 0),
                 p(srv["resume"], "p50"), p(lat["ttft"], "p50"), p(lat["ttft"], "p90"),
                 p(lat["itl"], "p50"), p(lat["itl"], "max"), p(lat["e2e"], "p50"),
                 m["throughput"]["output_tokens_per_s"]])
head = ["pool", "done", "failed", "resumed", "resumes", "resume stall p50 ms", "TTFT p50 ms",
        "TTFT p90 ms", "ITL p50 ms", "ITL max ms", "e2e p50 ms", "out tok/s"]
lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
for r in rows:
    lines.append("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in r) + " |")
r0, r1 = rows
lines.append("")
lines.append(f"tight/roomy: TTFT p50 {r1[6] / r0[6]:.2f}x, e2e p50 {r1[10] / r0[10]:.2f}x, "
             f"output tokens/s {r1[11] / r0[11]:.2f}x")
text = "\n".join(lines)
print(text)
open(out, "w").write(text + "\n")
sys.exit(0 if ok else 1)
EOF
