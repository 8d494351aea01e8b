#!/usr/bin/env bash
# Compute after cancel: long prompts whose deadline passes while the prefill node computes them,
# through a 1 prefill + 1 decode loopback cluster. Prints the prefill node's own counters
# (GET /metrics): forward-pass time spent on requests after they stopped, passes abandoned, and
# one uncancelled prompt's compute per chunk (--max_batch_tokens) for scale.
#
#   scripts/bench_cancel.sh                              # 12 prompts of 3,000 tokens, 1 s deadline
#   scripts/bench_cancel.sh --requests 12 --prompt 3000 --timeout 1 --parallel 3 --model M
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${DUET_BUILD_DIR:-$ROOT/build}"
MODEL="$ROOT/models/smollm2-135m-instruct-q4_1.gguf"
REQUESTS=12
PROMPT=3000
TIMEOUT=1
PARALLEL=3
while [ $# -gt 0 ]; do
  case "$1" in
    --requests) REQUESTS="$2"; shift ;;
    --prompt) PROMPT="$2"; shift ;;
    --timeout) TIMEOUT="$2"; shift ;;
    --parallel) PARALLEL="$2"; shift ;;
    --model) MODEL="$2"; shift ;;
    --build) BUILD="$2"; shift ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "bench_cancel.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
. "$ROOT/scripts/loopback_lib.sh"
loopback_inputs cancel
start_loopback "$DUET" "$OUT" --prefill 1 --decode 1 --model "$MODEL" --transport shm --threads 2 \
  --node_metrics
PMETRICS="$(awk '/^metrics prefill-/{print $3; exit}' "$OUT/serve.out")"
metric() { curl -s "$PMETRICS" | awk -v s="$1" 'index($1, s) == 1 {t += $2} END {printf "%.6f\n", t + 0}'; }
ids() { awk -v n="$PROMPT" -v seed="$1" 'BEGIN {srand(seed); for (i = 0; i < n; i++) printf "%s%d", (i ? "," : ""), 200 + int(rand() * 40000)}'; }

# Scale: one prompt of the same length, not cancelled.
"$DUET" generate --server "$ADDR" --prompt-ids "$(ids 1)" --max-tokens 1 --timeout_s 120 >/dev/null
full_s="$(metric duet_prefill_compute_seconds_sum)"
budget=2048  # the prefill node's --max_batch_tokens default, which serve --loopback keeps
chunks=$(( (PROMPT + budget - 1) / budget ))

# The cancelled ones: PARALLEL at a time, each with a deadline shorter than its prefill.
for i in $(seq 1 "$REQUESTS"); do
  "$DUET" generate --server "$ADDR" --prompt-ids "$(ids $((i + 1)))" --max-tokens 1 \
    --timeout_s "$TIMEOUT" >/dev/null 2>&1 &
  if (( i % PARALLEL == 0 )); then wait $(jobs -p | grep -v "^$SERVE\$") 2>/dev/null || true; fi
done
sleep 3  # the node ends what it still runs
after_s="$(metric duet_prefill_compute_after_stop_seconds_total)"
abandoned="$(metric duet_prefill_passes_abandoned_total)"
stopped="$(metric duet_prefill_requests_stopped_in_pass_total)"
awk -v full="$full_s" -v chunks="$chunks" -v after="$after_s" -v stopped="$stopped" \
  -v abandoned="$abandoned" -v n="$REQUESTS" -v p="$PROMPT" -v b="$budget" 'BEGIN {
  chunk = full / chunks
  printf "prompt %d tokens, chunk %d tokens: uncancelled prefill %.3f s (%.3f s per chunk)\n", p, b, full, chunk
  printf "requests %d, stopped in a pass %d, passes abandoned %d\n", n, stopped, abandoned
  per = (stopped > 0) ? after / stopped : 0
  ratio = (chunk > 0) ? per / chunk : 0
  printf "compute after stop: %.3f s in all, %.3f s per request stopped in a pass = %.2f chunks\n", after, per, ratio
}'
