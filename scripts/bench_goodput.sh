#!/usr/bin/env bash
# Goodput (DistServe): the highest request rate at which --slo-attainment (default 90 %) of the
# requests meet both the TTFT and the TPOT target. Sweeps Poisson rates of short prompts for
# colocated vs disaggregated 1 prefill + 1 decode on the same 2 cores, and prints (and writes to
# OUT/goodput.md) one Markdown table: per rate, each setup's SLO attainment (both targets, and
# each alone) and its p90 TTFT / TPOT; then each setup's goodput, or "below the lowest rate".
#
#   scripts/bench_goodput.sh                       # ~5 min on 2 cores
#   scripts/bench_goodput.sh --rates "4 5 6 7 8" --duration 40 --slo-ttft-ms 500 --slo-tpot-ms 80
#   options: --model PATH (default: synthetic smollm2-135m preset, made if missing)
#            --rates "2 4 6 8 10" --duration S (20, per rate) --input-len 32-64 --output-len 32
#            --slo-ttft-ms MS (300) --slo-tpot-ms MS (100) --slo-attainment F (0.9)
#            --setups "colocated disagg" --transport shm|tcp --out DIR (bench/results/goodput)
#            --build DIR --seed N (1: the same prompts and arrivals for both setups)
#            --table-only (no runs: the table and the plot again from OUT/raw)
#
# Beside the table it plots each setup's SLO attainment against the rate to OUT/goodput.svg with
# gnuplot (Debian: gnuplot-nox); without gnuplot it says so and skips the plot.
#
# The default targets come from first measured runs (docs/benchmarks.md, "Goodput"): about 2x
# the slower setup's p90 at 1 req/s (disaggregated: TTFT 140 ms, TPOT 48 ms on the 2-core Xeon),
# so that both setups meet them when lightly loaded and the sweep finds where each stops; the
# default rates bracket both setups' knees there.
# CPU pinning as scripts/bench_compare.sh: colocated on cores 0-1 with 2 threads; disaggregated
# with the prefill node on core 0 and the decode node on core 1, 1 thread each; the coordinator
# and the load generator float over cores 0-1. Needs 2 cores. Everything started is stopped on
# EXIT, INT and TERM.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${DUET_BUILD_DIR:-$ROOT/build}"
RESULTS="$ROOT/bench/results/goodput"
MODEL=""
RATES="2 4 6 8 10"
DURATION=20
INPUT_LEN=32-64
OUTPUT_LEN=32
SLO_TTFT_MS=300
SLO_TPOT_MS=100
SLO_ATTAINMENT=0.9
SETUPS="colocated disagg"
TRANSPORT=shm
SEED=1
TABLE_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL="$2"; shift ;;
    --rates) RATES="$2"; shift ;;
    --duration) DURATION="$2"; shift ;;
    --input-len) INPUT_LEN="$2"; shift ;;
    --output-len) OUTPUT_LEN="$2"; shift ;;
    --slo-ttft-ms) SLO_TTFT_MS="$2"; shift ;;
    --slo-tpot-ms) SLO_TPOT_MS="$2"; shift ;;
    --slo-attainment) SLO_ATTAINMENT="$2"; shift ;;
    --setups) SETUPS="$2"; shift ;;
    --transport) TRANSPORT="$2"; shift ;;
    --out) RESULTS="$2"; shift ;;
    --build) BUILD="$2"; shift ;;
    --seed) SEED="$2"; shift ;;
    --table-only) TABLE_ONLY=1 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "bench_goodput.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
command -v python3 >/dev/null || { echo "bench_goodput.sh: needs python3" >&2; exit 1; }
if [ "$TABLE_ONLY" = 1 ]; then
  OUT="$(mktemp -d /tmp/duet-goodput-XXXXXX)"  # the plot's data; no server, model or cores needed
else
  command -v taskset >/dev/null || { echo "bench_goodput.sh: needs taskset (util-linux)" >&2; exit 1; }
  if [ "$(nproc)" -lt 2 ]; then echo "bench_goodput.sh: needs 2 cores" >&2; exit 1; fi
  if [ -z "$MODEL" ]; then
    MODEL="$ROOT/models/smollm2-135m-synthetic"
    if [ ! -f "$MODEL/config.json" ]; then
      "$BUILD/cli/duet-make-model" --preset smollm2-135m --seed 1 --out "$MODEL"
    fi
  fi
  . "$ROOT/scripts/loopback_lib.sh"
  loopback_inputs goodput  # DUET (checked), OUT: a temp dir for the logs
fi
RAW="$RESULTS/raw"
mkdir -p "$RAW"

SERVE_PID=""
BENCH_PID=""
stop_server() {
  if [ -n "$SERVE_PID" ]; then stop_pid "$SERVE_PID"; SERVE_PID=""; fi
}
cleanup() {
  if [ -n "$BENCH_PID" ]; then stop_pid "$BENCH_PID"; BENCH_PID=""; fi
  stop_server
  rm -rf "$OUT"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
start_server() { start_pinned_server "$1" "$OUT/serve.out" "${@:2}" || exit 1; }

# run_rates NAME NOTE: every rate against the server at $ADDR, one JSON report each. The load
# generator runs in the background so that INT/TERM stop it at once.
run_rates() {
  local name="$1" note="$2" rc
  for rate in $RATES; do
    echo "== $name at $rate req/s for ${DURATION}s"
    taskset -c 0-1 "$DUET" bench serve --server "$ADDR" --request-rate "$rate" \
      --duration-s "$DURATION" --warmup-requests 1 --input-len "$INPUT_LEN" \
      --output-len "$OUTPUT_LEN" --seed "$SEED" --timeout-s 60 \
      --slo-ttft-ms "$SLO_TTFT_MS" --slo-tpot-ms "$SLO_TPOT_MS" \
      --slo-attainment "$SLO_ATTAINMENT" --bench-label "$name" --bench-note "$note" \
      --json-out "$RAW/$name-rate$rate.json" >"$OUT/bench.out" 2>&1 &
    BENCH_PID=$!
    rc=0
    wait "$BENCH_PID" || rc=$?
    BENCH_PID=""
    grep -E '^\[all\]|^\[main\]|SLO \(' "$OUT/bench.out" | head -2 || true
    if [ "$rc" = 3 ]; then
      echo "bench_goodput.sh: $name at $rate: some requests failed (they count as missing the SLO)" >&2
    elif [ "$rc" != 0 ]; then
      cat "$OUT/bench.out" >&2
      exit 1
    fi
  done
}

[ "$TABLE_ONLY" = 1 ] && SETUPS_RUN="" || SETUPS_RUN="$SETUPS"
START=$(date +%s)
COMMON=(--model "$MODEL" --kv_cache_bytes 1073741824)
if [[ " $SETUPS_RUN " == *" colocated "* ]]; then
  start_server 0-1 --colocated --threads 2 "${COMMON[@]}"
  run_rates colocated "colocated: one process on cores 0-1, 2 threads"
  stop_server
fi
if [[ " $SETUPS_RUN " == *" disagg "* ]]; then
  start_server 0-1 --loopback --prefill 1 --decode 1 --threads 1 --transport "$TRANSPORT" \
    "${COMMON[@]}"
  taskset -a -p -c 0 "$(node_pid prefill-0 "$OUT/serve.out")" >/dev/null
  taskset -a -p -c 1 "$(node_pid decode-0 "$OUT/serve.out")" >/dev/null
  run_rates disagg "disaggregated 1P1D (KV over $TRANSPORT): prefill on core 0, decode on core 1, 1 thread each"
  stop_server
fi
[ "$TABLE_ONLY" = 1 ] || echo "== sweep took $(( $(date +%s) - START )) s"

python3 - "$RAW" "$RATES" "$SETUPS" "$SLO_TTFT_MS" "$SLO_TPOT_MS" "$SLO_ATTAINMENT" \
  "$RESULTS/goodput.md" "$OUT/plot" <<'EOF'
import json, os, sys
raw, rates, setups, ttft, tpot, target, out, plot = sys.argv[1:]
rates = rates.split()
setups = [s for s in ("colocated", "disagg") if s in setups.split()]
names = {"colocated": "colocated", "disagg": "disagg 1P1D"}
target = float(target)
rep = {}
for s in setups:
    for r in rates:
        path = os.path.join(raw, f"{s}-rate{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                rep[s, r] = json.load(f)["classes"]["all"]
pct = lambda x: f"{100 * x:.1f}".replace(".0", "")
lines = [f"SLO: TTFT <= {ttft} ms and TPOT <= {tpot} ms for >= {pct(target)} % of requests "
         "(bold: attainment reached)",
         "", "| rate (req/s) | " + " | ".join(
             f"{names[s]}: both / TTFT / TPOT met (%) | {names[s]}: n, p90 TTFT / TPOT (ms)"
             for s in setups) + " |",
         "|---|" + "---|---|" * len(setups)]
for r in rates:
    cells = []
    for s in setups:
        c = rep.get((s, r))
        if c is None:
            cells += ["(no run)", ""]
            continue
        g, l = c["goodput"], c["latency_ms"]
        mark = "**" if g["meets_target"] else ""
        cells.append(f"{mark}{pct(g['slo_attainment'])}{mark} / {pct(g['ttft_attainment'])} / "
                     f"{pct(g['tpot_attainment'])}")
        cells.append(f"{g['requests_judged']}, {l['ttft']['p90']:.0f} / {l['tpot']['p90']:.1f}")
    lines.append(f"| {r} | " + " | ".join(cells) + " |")
goodput = {}
cells = []
for s in setups:
    met = [r for r in rates if (s, r) in rep and rep[s, r]["goodput"]["meets_target"]]
    if not met:
        goodput[s] = None
        cells += ["below the lowest rate", ""]
        continue
    best = max(met, key=float)
    goodput[s] = float(best)
    missed = [r for r in rates if float(r) < float(best) and r not in met]
    note = f" (missed at {', '.join(missed)})" if missed else ""
    cells += [f"**{best} req/s**{note}", ""]
lines.append("| **goodput** | " + " | ".join(cells) + " |")
if goodput.get("colocated") and goodput.get("disagg"):
    lines += ["", f"goodput disagg / colocated: {goodput['disagg'] / goodput['colocated']:.2f}x"]
text = "\n".join(lines) + "\n"
print(text, end="")
with open(out, "w") as f:
    f.write(text)
# The plot's inputs: one row per rate, attainment (%) of both targets, TTFT and TPOT per setup
# ("?": no run); and the gnuplot settings that name the setups and their goodput.
with open(plot + ".tsv", "w") as f:
    for r in rates:
        row = [r]
        for s in setups:
            g = rep[s, r]["goodput"] if (s, r) in rep else None
            row += [f"{100 * g[k]:.2f}" if g else "?"
                    for k in ("slo_attainment", "ttft_attainment", "tpot_attainment")]
        f.write("\t".join(row) + "\n")
with open(plot + ".gp", "w") as f:
    f.write(f"target = {100 * target}\n")
    f.write(f'slo = "TTFT <= {ttft} ms and TPOT <= {tpot} ms"\n')
    f.write(f"n = {len(setups)}\n")
    for i, s in enumerate(setups):
        g = goodput[s]
        f.write(f'name{i} = "{names[s]} (goodput {f"{g:g} req/s" if g else "below the lowest rate"})"\n')
EOF
if command -v gnuplot >/dev/null; then
  gnuplot -e "load '$OUT/plot.gp'; data = '$OUT/plot.tsv'; out = '$RESULTS/goodput.svg'" \
    "$ROOT/scripts/goodput_plot.gp"
  echo "plot: $RESULTS/goodput.svg"
else
  echo "bench_goodput.sh: gnuplot not found (Debian: apt-get install gnuplot-nox): no plot" >&2
fi
