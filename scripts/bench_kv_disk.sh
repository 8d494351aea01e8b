#!/usr/bin/env bash
# The prefix cache's disk tier, side by side in one go (same model, same workload seed): a
# colocated server whose KV pool holds about 2 of 8 shared prefixes (8 x 512 tokens, requests
# cycling over them, so the pool alone keeps evicting what the next requests need), run
#   1. without a tier (every prefix recomputed once it was evicted),
#   2. with --kv_disk_path (write-back: evicted blocks go to disk, later requests load them),
#   3. restarted on the tier the second run left (warm restart: the first requests hit too).
# Then 2,048-token prefixes (8 of them, the pool holds 2.5) without and with the tier: TTFT of a
# 2k-token disk hit against recomputing it. Then multi-turn chats (8 sessions of 6 turns, 3 at a
# time) on an unbounded pool, on a pool too small to keep them, and on that pool with the tier.
# Prints one table (prefix hit rate, prompt tokens loaded from disk, TTFT p50 and p90) and writes
# every JSON report and the table (summary.md) to --out.
#
#   scripts/bench_kv_disk.sh             # ~5 min on 2 cores
#   options: --model PATH (default: models/smollm2-135m-instruct-q4_1.gguf if present, else the
#            synthetic smollm2-135m preset, made if missing) --out DIR --build DIR --seed N
#            --requests N (default 32) --disk_dir DIR (default: a temporary directory)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${DUET_BUILD_DIR:-$ROOT/build}"
OUT="$ROOT/bench/results/kv_disk"
MODEL=""
SEED=1
REQUESTS=32
DISK_DIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --build) BUILD="$2"; shift ;;
    --seed) SEED="$2"; shift ;;
    --requests) REQUESTS="$2"; shift ;;
    --disk_dir) DISK_DIR="$2"; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "bench_kv_disk.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
DUET="$BUILD/cli/duet"
[ -x "$DUET" ] || { echo "bench_kv_disk.sh: $DUET not built (scripts/build.sh duet)" >&2; exit 1; }
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
rm -f "$RAW"/*.json
OWN_DISK=0
if [ -z "$DISK_DIR" ]; then DISK_DIR="$(mktemp -d)"; OWN_DISK=1; fi

# Each arm's server runs on both cores (start_pinned_server, stop_pid: loopback_lib.sh).
. "$ROOT/scripts/loopback_lib.sh"
SERVE_PID=""
SERVE_LOG="$(mktemp)"
# SIGTERM first: a clean stop writes the pool's cached blocks to the tier.
stop_server() {
  if [ -n "$SERVE_PID" ]; then stop_pid "$SERVE_PID"; SERVE_PID=""; fi
}
cleanup() {
  stop_server
  rm -f "$SERVE_LOG"
  if [ "$OWN_DISK" = 1 ]; then rm -rf "$DISK_DIR"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Prompt ids in [17, 255] (ordinary tokens of SmolLM2's vocabulary); one request at a time.
SHARED=(--workload shared_prefix --shared_prefix_len 512 --num_prefixes 8 --suffix_len 32-48
        --output_len 4 --num_requests "$REQUESTS" --concurrency 1 --seed "$SEED"
        --warmup_requests 0 --timeout_s 240)
# The pool: 2.5 prefixes of SmolLM2's KV (float32: 46080 bytes a token).
COMMON="--colocated --threads 2 --model $MODEL --kv_cache_bytes 62914560 --node_metrics"
TIER="--kv_disk_path $DISK_DIR --kv_disk_bytes 1073741824"

LONG=(--workload shared_prefix --shared_prefix_len 2048 --num_prefixes 8 --suffix_len 32-48
      --output_len 4 --num_requests 24 --concurrency 1 --seed "$SEED" --warmup_requests 0
      --timeout_s 240)
MULTI=(--workload multi_turn --num_sessions 8 --turns 6 --turn_len 64-96 --output_len 16
       --concurrency 3 --seed "$SEED" --warmup_requests 0 --timeout_s 240)
LONG_POOL="--kv_cache_bytes 240844800"   # 5,226 tokens: 2.5 prefixes of 2,048 + a suffix
BIG_POOL="--kv_cache_bytes 1073741824"   # every chat's whole history
SMALL_POOL="--kv_cache_bytes 62914560"   # 1,360 tokens: about two of the 8 chats

# arm NAME "SERVE ARGS" WORKLOAD...: one server, one benchmark run, one JSON.
arm() {
  local name="$1" serve_args="$2"; shift 2
  echo "== $name: serve $serve_args"
  # shellcheck disable=SC2086
  start_pinned_server 0-1 "$SERVE_LOG" $serve_args || exit 1
  local metrics
  metrics="$(awk '/^metrics colocated-0 /{print $3; exit}' "$SERVE_LOG")"
  "$DUET" bench serve --server "$ADDR" "$@" --bench_label "$name" \
    --bench_note "serve $serve_args" --json_out "$RAW/$name.json" > "$RAW/$name.txt" ||
    echo "bench_kv_disk.sh: $name: the run reported failed requests (see $RAW/$name.txt)" >&2
  if [ -n "$metrics" ]; then
    curl -s "$metrics" | grep -E '^duet_(colocated_prefix_cache|kv_disk)' > "$RAW/$name.metrics" || true
  fi
  stop_server
}

START=$(date +%s)
arm no-tier "$COMMON" "${SHARED[@]}"
arm tier "$COMMON $TIER" "${SHARED[@]}"
arm tier-restarted "$COMMON $TIER" "${SHARED[@]}"
rm -rf "${DISK_DIR:?}"/*
arm long-no-tier "$COMMON $LONG_POOL" "${LONG[@]}"
arm long-tier "$COMMON $LONG_POOL $TIER" "${LONG[@]}"
rm -rf "${DISK_DIR:?}"/*
arm mt-unbounded "$COMMON $BIG_POOL" "${MULTI[@]}"
arm mt-small "$COMMON $SMALL_POOL" "${MULTI[@]}"
arm mt-small-tier "$COMMON $SMALL_POOL $TIER" "${MULTI[@]}"
echo "== took $(( $(date +%s) - START )) s on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); model $(basename "$MODEL")"

python3 - "$RAW" "$OUT/summary.md" <<'EOF'
import json, os, sys
raw, out = sys.argv[1], sys.argv[2]
rows = ["| run | requests | prefix hit rate | prompt tokens from disk | TTFT p50 (ms) | TTFT p90 (ms) |",
        "|---|---|---|---|---|---|"]
ttft = {}
names = ["no-tier", "tier", "tier-restarted", "long-no-tier", "long-tier", "mt-unbounded",
         "mt-small", "mt-small-tier"]
hits = {}
for n in names:
    p = os.path.join(raw, n + ".json")
    if not os.path.exists(p): continue
    m = json.load(open(p))["classes"]["main"]
    metrics = {}
    mp = os.path.join(raw, n + ".metrics")
    if os.path.exists(mp):
        for line in open(mp):
            k, v = line.rsplit(" ", 1)
            metrics[k] = float(v)
    disk = metrics.get("duet_colocated_prefix_cache_tier_hits_total")
    t = m["latency_ms"]["ttft"]
    ttft[n] = t["p50"]
    hits[n] = m["prefix_cache"]["hit_rate_prefill"] or 0
    rows.append("| %s | %d | %.1f%% | %s | %.0f | %.0f |" % (
        n, m["requests"]["completed"], 100 * (m["prefix_cache"]["hit_rate_prefill"] or 0),
        "-" if disk is None else "%d" % disk, t["p50"], t["p90"]))
text = "\n".join(rows) + "\n"
text += "\n"
if "no-tier" in ttft and "tier" in ttft:
    text += "- 512-token prefixes: TTFT p50 with the tier / without: %.2fx\n" % (
        ttft["tier"] / ttft["no-tier"])
if "long-no-tier" in ttft and "long-tier" in ttft:
    r = ttft["long-tier"] / ttft["long-no-tier"]
    text += "- 2,048-token prefixes: TTFT p50 with the tier / without: %.2fx (target <= 0.3x: %s)\n" % (
        r, "holds" if r <= 0.3 else "does not hold")
if "mt-unbounded" in hits and "mt-small-tier" in hits and hits["mt-unbounded"]:
    r = hits["mt-small-tier"] / hits["mt-unbounded"]
    text += ("- multi-turn: hit rate on the small pool with the tier / the unbounded pool's: %.2fx "
             "(target >= 0.9x: %s); without the tier: %.2fx\n") % (
        r, "holds" if r >= 0.9 else "does not hold",
        hits.get("mt-small", 0) / hits["mt-unbounded"])
print(text)
open(out, "w").write(text)
EOF
