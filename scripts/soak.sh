#!/usr/bin/env bash
# Memory over time: mixed load (random prompts of 64-2,048 tokens at a Poisson rate, and
# multi-turn chats in a closed loop) through a 2 prefill + 2 decode loopback cluster for
# --duration_s, sampling every process's resident memory and its KV pool's blocks by state (GET
# /metrics) every --sample_s. Resident memory is split as /proc/PID/status does: RssAnon (the
# process's own) and RssShmem (shared mappings: over shm a prefill node maps the decode nodes'
# pools it writes into, so those pages count in both processes). Writes soak.csv and prints, per
# process, each at the first sample, a quarter, half and the end, and the growth over the last half.
# Not part of CI: an hour on two cores.
#
#   scripts/soak.sh                                  # one hour, SmolLM2 Q4_1, samples every 10 s
#   scripts/soak.sh --duration_s 600 --sample_s 5 --rate 0.2 --chats 1 --out /tmp/soak
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${DUET_BUILD_DIR:-$ROOT/build}"
MODEL="$ROOT/models/smollm2-135m-instruct-q4_1.gguf"
DURATION=3600
SAMPLE=10
RATE=0.2      # random prompts per second
CHATS=1       # multi-turn chats in flight
DEST=""
while [ $# -gt 0 ]; do
  case "$1" in
    --duration_s) DURATION="$2"; shift ;;
    --sample_s) SAMPLE="$2"; shift ;;
    --rate) RATE="$2"; shift ;;
    --chats) CHATS="$2"; shift ;;
    --model) MODEL="$2"; shift ;;
    --build) BUILD="$2"; shift ;;
    --out) DEST="$2"; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "soak.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
. "$ROOT/scripts/loopback_lib.sh"
loopback_inputs soak
[ -z "$DEST" ] || { mkdir -p "$DEST"; OUT="$DEST"; }
start_loopback "$DUET" "$OUT" --prefill 2 --decode 2 --model "$MODEL" --transport shm --threads 1 \
  --node_metrics

# name pid metrics-url, one line per process (the coordinator has no pool of its own).
procs() {
  local pid name url
  for pid in $(pgrep -P "$SERVE"); do
    name="$(tr '\0' '\n' <"/proc/$pid/cmdline" | sed -n 's/^--node_id=//p')"
    [ -n "$name" ] || name=coordinator
    url="$(awk -v n="$name" '$1 == "metrics" && $2 == n {print $3}' "$OUT/serve.out")"
    echo "$name $pid ${url:--}"
  done
}
blocks() {  # used evictable free from a node's kv_blocks gauge
  [ "$1" = "-" ] && { echo "0 0 0"; return; }
  curl -s --max-time 5 "$1" | awk '
    /^duet_(prefill|decode)_kv_blocks\{/ {
      v = $2; s = $1; sub(/.*state="/, "", s); sub(/".*/, "", s); n[s] += v }
    END { printf "%d %d %d\n", n["used"], n["evictable"], n["free"] }'
}

CLIENTS=()
"$DUET" bench serve --server "$ADDR" --request_rate "$RATE" --duration_s "$DURATION" \
  --warmup_requests 0 --seed 1 --workload random --input_len 64-2048 --output_len 16-128 \
  --json_out "$OUT/report0.json" >"$OUT/bench0.out" 2>&1 &
CLIENTS+=($!)
"$DUET" bench serve --server "$ADDR" --concurrency "$CHATS" --duration_s "$DURATION" \
  --warmup_requests 0 --seed 2 --workload multi_turn --num_sessions 2000 --turns 4 \
  --output_len 16-128 --json_out "$OUT/report1.json" >"$OUT/bench1.out" 2>&1 &
CLIENTS+=($!)
trap 'kill "${CLIENTS[@]}" 2>/dev/null; kill "$SERVE" 2>/dev/null; wait 2>/dev/null || true' EXIT

echo "elapsed_s,process,rss_mib,anon_mib,shmem_mib,kv_used,kv_evictable,kv_free" >"$OUT/soak.csv"
start=$(date +%s)
while true; do
  now=$(( $(date +%s) - start ))
  while read -r name pid url; do
    rss="$(awk '/^(VmRSS|RssAnon|RssShmem):/ {printf "%s%.1f", (n++ ? "," : ""), $2 / 1024}' \
      "/proc/$pid/status" 2>/dev/null || echo 0,0,0)"
    echo "$now,$name,$rss,$(blocks "$url" | tr ' ' ',')" >>"$OUT/soak.csv"
  done < <(procs)
  alive=0
  for c in "${CLIENTS[@]}"; do kill -0 "$c" 2>/dev/null && alive=1; done
  [ "$alive" = 1 ] || break
  sleep "$SAMPLE"
done
for f in "$OUT"/bench*.out; do grep -E 'completed' "$f" | tail -1 || true; done
echo "samples: $OUT/soak.csv"
python3 - "$OUT/soak.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
by = {}
for r in rows:
    by.setdefault(r["process"], []).append(r)
print(f"{'process':<12} {'MiB':<7} {'first':>8} {'1/4':>8} {'1/2':>8} {'end':>8} {'max':>8} {'last half':>10}")
for name, s in sorted(by.items()):
    for col in ("rss_mib", "anon_mib", "shmem_mib"):
        v = [float(r[col]) for r in s]
        at = lambda f: v[min(len(v) - 1, int(f * (len(v) - 1)))]
        print(f"{name:<12} {col[:-4]:<7} {v[0]:8.1f} {at(.25):8.1f} {at(.5):8.1f} {v[-1]:8.1f} "
              f"{max(v):8.1f} {v[-1] - at(.5):+10.1f}")
    held = int(s[-1]["kv_used"]) + int(s[-1]["kv_evictable"])
    print(f"{name:<12} kv blocks held at the end: {held}")
PY
