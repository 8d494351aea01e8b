#!/usr/bin/env bash
# Serving benchmark sweep: colocated vs disaggregated (layer-pipelined KV transfer) vs
# disaggregated with bulk transfer (--no_layer_pipelining), at a few Poisson request rates of
# long prompts (512-1024 tokens) running against background decodes. Writes one JSON report per
# (setup, rate), a summary (JSON + Markdown table) and PNG plots (gnuplot).
#
#   scripts/bench_compare.sh --quick                 # ~4 min: 1 rate, 45 s
#   scripts/bench_compare.sh --out bench/results     # ~16 min: 2 rates, 150 s each
# (A 512-1024-token prefill takes 2.5-5 s on one core of a 2-core machine, so the default
# rates are low; raise --rates on a bigger machine.)
#   options: --model PATH (default: synthetic smollm2-135m preset, made if missing)
#            --rates "0.1 0.2" --duration S --transport shm|tcp --out DIR --build DIR
#            --setups "colocated pipelined bulk" (a subset runs fewer arms)
#
# CPU pinning (each side gets the same cores, printed with the results): colocated runs on cores
# 0-1 with 2 threads; disaggregated puts the prefill node on core 0 and the decode node on core
# 1 with 1 thread each; the coordinator and the load generator float over cores 0-1. Needs
# 2 cores.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${DUET_BUILD_DIR:-$ROOT/build}"
OUT="$ROOT/bench/results"
MODEL=""
RATES="0.06 0.12"
DURATION=150
TRANSPORT=shm
QUICK=0
SETUPS="colocated pipelined bulk"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; RATES="0.05"; DURATION=45 ;;
    --model) MODEL="$2"; shift ;;
    --rates) RATES="$2"; shift ;;
    --setups) SETUPS="$2"; shift ;;
    --duration) DURATION="$2"; shift ;;
    --transport) TRANSPORT="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --build) BUILD="$2"; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "bench_compare.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
DUET="$BUILD/cli/duet"
[ -x "$DUET" ] || { echo "bench_compare.sh: $DUET not built (scripts/build.sh duet duet-make-model)" >&2; exit 1; }
command -v taskset >/dev/null || { echo "bench_compare.sh: needs taskset (util-linux)" >&2; exit 1; }
if [ "$(nproc)" -lt 2 ]; then echo "bench_compare.sh: needs 2 cores" >&2; exit 1; fi
if [ -z "$MODEL" ]; then
  MODEL="$ROOT/models/smollm2-135m-synthetic"
  if [ ! -f "$MODEL/config.json" ]; then
    "$BUILD/cli/duet-make-model" --preset smollm2-135m --seed 1 --out "$MODEL"
  fi
fi
RAW="$OUT/raw"
mkdir -p "$RAW"

# The workload: long prompts at the swept rate (class "main"), and 2 background requests with
# short prompts and long outputs decoding all the time (class "background").
WORKLOAD=(--input_len 512-1024 --output_len 16 --background_concurrency 2
          --background_input_len 32 --background_output_len 64 --seed 1
          --slo_ttft_ms 15000 --slo_tpot_ms 250 --timeout_s 240)

SERVE_PID=""
SERVE_LOG=""
. "$ROOT/scripts/loopback_lib.sh"
stop_server() {
  if [ -n "$SERVE_PID" ]; then stop_pid "$SERVE_PID"; SERVE_PID=""; fi
}
trap 'stop_server; [ -n "$SERVE_LOG" ] && rm -f "$SERVE_LOG"' EXIT
trap 'exit 130' INT TERM

start_server() { SERVE_LOG="$(mktemp)"; start_pinned_server "$1" "$SERVE_LOG" "${@:2}"; }

# run_arm NAME NOTE: runs every rate against the server at $ADDR.
run_arm() {
  local name="$1" note="$2" first=1
  for rate in $RATES; do
    echo "== $name at $rate req/s for ${DURATION}s ($note)"
    local warm=0; [ $first = 1 ] && warm=1; first=0
    taskset -c 0-1 "$DUET" bench serve --server "$ADDR" --request_rate "$rate" \
      --duration_s "$DURATION" --warmup_requests "$warm" "${WORKLOAD[@]}" \
      --bench_label "$name" --bench_note "$note" --json_out "$RAW/$name-rate$rate.json" ||
      echo "bench_compare.sh: $name at $rate: the run reported failed requests (see above)" >&2
  done
}

COMMON=(--model "$MODEL" --kv_cache_bytes 1073741824)
START=$(date +%s)

if [[ " $SETUPS " == *" colocated "* ]]; then
  start_server 0-1 --colocated --threads 2 "${COMMON[@]}"
  run_arm colocated "colocated: one process on cores 0-1, 2 threads"
  stop_server
fi

for arm in pipelined bulk; do
  [[ " $SETUPS " == *" $arm "* ]] || continue
  extra=()
  [ $arm = bulk ] && extra=(--no_layer_pipelining)
  start_server 0-1 --loopback --prefill 1 --decode 1 --threads 1 --transport "$TRANSPORT" \
    "${COMMON[@]}" "${extra[@]}"
  P="$(node_pid prefill-0 "$SERVE_LOG")"; D="$(node_pid decode-0 "$SERVE_LOG")"
  taskset -a -p -c 0 "$P" >/dev/null
  taskset -a -p -c 1 "$D" >/dev/null
  run_arm "disagg-$arm" "disaggregated ($arm KV over $TRANSPORT): prefill on core 0, decode on core 1, 1 thread each"
  stop_server
done

echo "== sweep took $(( $(date +%s) - START )) s"
python3 "$ROOT/scripts/bench_plot.py" --raw "$RAW" --out "$OUT" \
  --machine "$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(. /etc/os-release; echo "$PRETTY_NAME"), no GPU; model $(basename "$MODEL")"
