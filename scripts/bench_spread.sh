#!/usr/bin/env bash
# Light-load spread: random prompts (nothing to hit in any cache) at a low Poisson rate through a
# 2 prefill + 2 decode loopback cluster (router cache_aware, the default), then each node's own
# counters (GET /metrics: duet_prefill_requests_total, duet_decode_requests_admitted_total).
# Prints how many requests each node took; exits 1 when a node of either kind took none.
#
#   scripts/bench_spread.sh                    # 300 requests at 5/s, SmolLM2 if present
#   scripts/bench_spread.sh --requests 60 --rate 5 --model models/tiny --build build
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${DUET_BUILD_DIR:-$ROOT/build}"
MODEL="$ROOT/models/smollm2-135m-instruct-q4_1.gguf"
REQUESTS=300
RATE=5
while [ $# -gt 0 ]; do
  case "$1" in
    --requests) REQUESTS="$2"; shift ;;
    --rate) RATE="$2"; shift ;;
    --model) MODEL="$2"; shift ;;
    --build) BUILD="$2"; shift ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "bench_spread.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
. "$ROOT/scripts/loopback_lib.sh"
loopback_inputs spread
start_loopback "$DUET" "$OUT" --prefill 2 --decode 2 --model "$MODEL" --transport shm --threads 1 \
  --node_metrics
"$DUET" bench serve --server "$ADDR" --request_rate "$RATE" --num_requests "$REQUESTS" \
  --input_len 64-256 --output_len 8 --warmup_requests 0 --json_out "$OUT/report.json" \
  >"$OUT/bench.out"
grep -E 'requests|failed' "$OUT/bench.out" | head -3 || true
status=0
while read -r _ name url; do
  case "$name" in
    prefill-*) series=duet_prefill_requests_total ;;
    decode-*) series=duet_decode_requests_admitted_total ;;
    *) continue ;;
  esac
  n="$(curl -s "$url" | awk -v s="$series" 'index($1, s) == 1 {t += $2} END {print t + 0}')"
  echo "$name $series $n"
  awk -v n="$n" 'BEGIN {exit !(n > 0)}' || status=1
done < <(grep '^metrics ' "$OUT/serve.out")
exit "$status"
