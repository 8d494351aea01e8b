#!/usr/bin/env bash
# Prefix-caching benchmark, side by side in one go (same model, same workload seed):
#   1. shared_prefix (4 prefixes of 512 tokens + 48-64-token suffixes: the prefix is ~90% of the
#      prompt) on a 1 prefill + 1 decode loopback cluster, cache on vs off (--enable_prefix_caching);
#   2. multi_turn (6 chats of 4 turns, 64-96-token user messages, 16 generated tokens a turn) on
#      a 1P/1D cluster (the single-prefill-node reference) and on a 2P/2D cluster with
#      --router cache_aware vs load vs round_robin;
#   3. disaggregated vs colocated (`serve --colocated`, cache on) for both workloads.
# Prints one table (hit rates P and D, TTFT p50, first-to-second-token gap p50, KV bytes sent
# per request, and per turn after the first) and checks the targets; writes every JSON report
# and the table (summary.md) to --out.
#
#   scripts/bench_prefix_cache.sh                       # ~6-8 min on 2 cores
#   scripts/bench_prefix_cache.sh --quick               # fewer requests (a smoke run)
#   options: --model PATH (default: models/smollm2-135m-instruct-q4_1.gguf if present, else
#            the synthetic smollm2-135m preset, made if missing) --out DIR --build DIR
#            --seed N --transport shm|tcp --summarize_only (reprint the table from --out's JSONs)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${DUET_BUILD_DIR:-$ROOT/build}"
OUT="$ROOT/bench/results/prefix_cache"
MODEL=""
SEED=1
TRANSPORT=shm
SP_REQUESTS=20
MT_SESSIONS=6
MT_TURNS=4
SUMMARIZE_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) SP_REQUESTS=8; MT_SESSIONS=3; MT_TURNS=3 ;;
    --summarize_only) SUMMARIZE_ONLY=1 ;;
    --model) MODEL="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --build) BUILD="$2"; shift ;;
    --seed) SEED="$2"; shift ;;
    --transport) TRANSPORT="$2"; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "bench_prefix_cache.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
DUET="$BUILD/cli/duet"
[ -x "$DUET" ] || { echo "bench_prefix_cache.sh: $DUET not built (scripts/build.sh duet duet-make-model)" >&2; exit 1; }
if [ -z "$MODEL" ]; then
  if [ -f "$ROOT/models/smollm2-135m-instruct-q4_1.gguf" ]; then
    MODEL="$ROOT/models/smollm2-135m-instruct-q4_1.gguf"
  else
    MODEL="$ROOT/models/smollm2-135m-synthetic"
    if [ ! -f "$MODEL/config.json" ]; then
      "$BUILD/cli/duet-make-model" --preset smollm2-135m --seed 1 --out "$MODEL"
    fi
  fi
fi
RAW="$OUT/raw"
mkdir -p "$RAW"
[ "$SUMMARIZE_ONLY" = 1 ] || rm -f "$RAW"/*.json

# The workloads. Prompt ids stay in [17, 255] (ordinary tokens of SmolLM2's vocabulary).
SHARED=(--workload shared_prefix --shared_prefix_len 512 --num_prefixes 4 --suffix_len 48-64
        --output_len 8 --num_requests "$SP_REQUESTS" --concurrency 1)
MULTI=(--workload multi_turn --num_sessions "$MT_SESSIONS" --turns "$MT_TURNS" --turn_len 64-96
       --output_len 16 --concurrency 3)
BENCH=(--seed "$SEED" --warmup_requests 1 --timeout_s 240)

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

# start_server ARGS...: starts `duet serve ARGS`, waits for "ready ADDR".
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
  echo "bench_prefix_cache.sh: the server did not become ready" >&2
  return 1
}

# arm NAME "SERVE ARGS" BENCH ARGS...: one server, one benchmark run, one JSON.
arm() {
  local name="$1" serve_args="$2"; shift 2
  echo "== $name: serve $serve_args"
  # shellcheck disable=SC2086
  start_server $serve_args
  "$DUET" bench serve --server "$ADDR" "${BENCH[@]}" "$@" --bench_label "$name" \
    --bench_note "serve $serve_args" --per_request --json_out "$RAW/$name.json" > "$RAW/$name.txt" ||
    echo "bench_prefix_cache.sh: $name: the run reported failed requests (see $RAW/$name.txt)" >&2
  stop_server
}

COMMON="--model $MODEL --kv_cache_bytes 536870912"
DISAGG1="--loopback --prefill 1 --decode 1 --threads 1 --transport $TRANSPORT $COMMON"
DISAGG2="--loopback --prefill 2 --decode 2 --threads 1 --transport $TRANSPORT $COMMON"
COLOC="--colocated --threads 2 $COMMON"
START=$(date +%s)

if [ "$SUMMARIZE_ONLY" = 0 ]; then
arm sp-1p1d-cache-on "$DISAGG1" "${SHARED[@]}"
arm sp-1p1d-cache-off "$DISAGG1 --enable_prefix_caching=false" "${SHARED[@]}"
arm sp-colocated-cache-on "$COLOC" "${SHARED[@]}"
arm mt-1p1d-cache_aware "$DISAGG1 --router cache_aware" "${MULTI[@]}"
for router in cache_aware load round_robin; do
  arm "mt-2p2d-$router" "$DISAGG2 --router $router" "${MULTI[@]}"
done
arm mt-colocated "$COLOC" "${MULTI[@]}"
echo "== took $(( $(date +%s) - START )) s on $(nproc) cores; model $(basename "$MODEL")"
fi

python3 - "$RAW" "$OUT/summary.md" <<'EOF'
import json, math, os, sys
raw, out = sys.argv[1], sys.argv[2]
names = ["sp-1p1d-cache-on", "sp-1p1d-cache-off", "sp-colocated-cache-on", "mt-1p1d-cache_aware",
         "mt-2p2d-cache_aware", "mt-2p2d-load", "mt-2p2d-round_robin", "mt-colocated"]
runs = {}
for n in names:
    p = os.path.join(raw, n + ".json")
    if os.path.exists(p):
        runs[n] = json.load(open(p))
BLOCK = 16
def main(n): return runs[n]["classes"]["main"]
def reqs(n): return [r for r in runs[n].get("requests", []) if r.get("ok") and r["class"] == "main"]
def pct(x): return "-" if x is None else "%.1f%%" % (100 * x)
# P sends whole blocks (the last one padded): the bytes of one block are the greatest common
# divisor of every transfer's size.
block_bytes = 0
for n in runs:
    for r in reqs(n):
        block_bytes = math.gcd(block_bytes, r.get("kv_bytes_sent", 0))
rows = ["| run | requests | hit rate P | hit rate D | TTFT p50 (ms) | 1st->2nd gap p50 (ms) | KV bytes / request (mean) | KV bytes / turn, turns >= 1 (mean) | KV blocks sent / turn vs ceil(new/16) + 1 (mean; turns within) |",
        "|---|---|---|---|---|---|---|---|---|"]
stats = {}
for n in names:
    if n not in runs: continue
    m = main(n); c = m["prefix_cache"]; coloc = "colocated" in n
    later = [r for r in reqs(n) if r.get("turn", -1) >= 1]
    kv_turn = sum(r.get("kv_bytes_sent", 0) for r in later) / len(later) if later else None
    new_turn = sum(r["new_tokens"] for r in later) / len(later) if later else None
    within = blocks = budget = None
    if later and block_bytes:
        sent = [r.get("kv_bytes_sent", 0) // block_bytes for r in later]
        allowed = [-(-r["new_tokens"] // BLOCK) + 1 for r in later]
        within = sum(a <= b for a, b in zip(sent, allowed))
        blocks, budget = sum(sent) / len(sent), sum(allowed) / len(allowed)
    stats[n] = dict(p=c["hit_rate_prefill"], d=c["hit_rate_decode"],
                    ttft=m["latency_ms"]["ttft"]["p50"], blocks=blocks, budget=budget,
                    within=within, later=len(later))
    rows.append("| %s | %d | %s | %s | %.0f | %.1f | %s | %s | %s |" % (
        n, m["requests"]["completed"], pct(c["hit_rate_prefill"]),
        "n/a" if coloc else pct(c["hit_rate_decode"]), m["latency_ms"]["ttft"]["p50"],
        m["latency_ms"]["first_to_second_gap"]["p50"],
        "n/a" if coloc else "%.0f" % c["kv_bytes_sent"]["mean"],
        "n/a" if coloc or kv_turn is None else "%.0f" % kv_turn,
        "n/a" if coloc or blocks is None else "%.2f vs %.2f; %d/%d" % (blocks, budget, within, len(later))))
checks = []
def check(what, ok, detail):
    checks.append("- %s: **%s** (%s)" % (what, "holds" if ok else "does not hold", detail))
s = stats
if "sp-1p1d-cache-on" in s and "sp-1p1d-cache-off" in s:
    r = s["sp-1p1d-cache-on"]["ttft"] / max(s["sp-1p1d-cache-off"]["ttft"], 1e-9)
    check("shared prefix ~90%: TTFT p50 with the cache <= 0.2x without", r <= 0.2, "%.2fx" % r)
if "mt-2p2d-cache_aware" in s and s["mt-2p2d-cache_aware"]["blocks"] is not None:
    a = s["mt-2p2d-cache_aware"]
    check("multi-turn 2P/2D cache_aware: KV moved per turn <= the new tokens' blocks + 1 block",
          a["within"] == a["later"],
          "%d of %d turns within; mean %.2f blocks sent vs %.2f allowed; %d bytes a block" % (
              a["within"], a["later"], a["blocks"], a["budget"], block_bytes))
if "mt-2p2d-cache_aware" in s and "mt-1p1d-cache_aware" in s and s["mt-1p1d-cache_aware"]["p"]:
    r = s["mt-2p2d-cache_aware"]["p"] / s["mt-1p1d-cache_aware"]["p"]
    check("multi-turn 2P/2D cache_aware: hit rate P >= 0.9x one prefill node's", r >= 0.9, "%.2fx" % r)
for other in ("load", "round_robin"):
    n = "mt-2p2d-" + other
    if n in s and "mt-2p2d-cache_aware" in s:
        a, b = s["mt-2p2d-cache_aware"], s[n]
        check("multi-turn 2P/2D %s loses hits against cache_aware" % other,
              (b["p"] or 0) < (a["p"] or 0) or (b["d"] or 0) < (a["d"] or 0),
              "P %s vs %s, D %s vs %s" % (pct(b["p"]), pct(a["p"]), pct(b["d"]), pct(a["d"])))
text = "\n".join(rows) + "\n\n" + "\n".join(checks) + "\n"
print(text)
open(out, "w").write(text)
EOF
