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
DUET="$BUILD/cli/duet"
[ -x "$DUET" ] || { echo "bench_spread.sh: $DUET not built" >&2; exit 2; }
[ -e "$MODEL" ] || { echo "bench_spread.sh: no model at $MODEL (scripts/get_model.sh)" >&2; exit 2; }
OUT="$(mktemp -d /tmp/duet-spread-XXXXXX)"
"$DUET" serve --loopback --prefill 2 --decode 2 --model "$MODEL" --transport shm --threads 1 \
  --node_metrics >"$OUT/serve.out" 2>"$OUT/serve.err" &
SERVE=$!
trap 'kill "$SERVE" 2>/dev/null; wait "$SERVE" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  grep -q '^ready ' "$OUT/serve.out" && break
  kill -0 "$SERVE" 2>/dev/null || { cat "$OUT/serve.err" >&2; exit 1; }
  sleep 0.2
done
ADDR="$(awk '/^ready /{print $2}' "$OUT/serve.out")"
[ -n "$ADDR" ] || { echo "bench_spread.sh: the cluster did not become ready" >&2; exit 1; }
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
