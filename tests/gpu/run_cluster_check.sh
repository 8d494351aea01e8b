#!/usr/bin/env bash
# The disaggregated cluster on the device: unpacks what tests/gpu/pack_offline_cluster.sh
# packed, writes the tiny synthetic model, generates once in one process (`duet generate`) and
# once through `duet serve --loopback` (1 prefill + 1 decode node, KV pools in the backend's
# memory, --kv_staging as given: on cuda "auto" stages through pinned host mirrors), and
# compares the greedy tokens. Also checks that --kv_staging=never is refused for a device pool.
# Called by run_device_checks.sh; runs without a GPU too (device cpu, staging always).
#   tests/gpu/run_cluster_check.sh CLUSTER_PACK.tar.xz OUT_DIR [DEVICE=cuda] [KV_STAGING=auto]
# Writes OUT_DIR/cluster.log; exit 0 when the tokens match, 1 when they differ, 2+ on errors.
set -uo pipefail
pack=$1 out=$2 device=${3:-cuda} staging=${4:-auto}
work=$(mktemp -d /tmp/duet-cluster-check.XXXXXX)
log=$out/cluster.log
: > "$log"
tar -xJf "$pack" -C "$work" || { echo "cannot unpack $pack" >> "$log"; exit 2; }
export LD_LIBRARY_PATH=$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export UCX_MODULE_DIR=$work/lib/ucx
duet=$work/bin/duet
serve_pid=
cleanup() {
  if [[ -n $serve_pid ]]; then kill "$serve_pid" 2> /dev/null; wait "$serve_pid" 2> /dev/null; fi
  rm -rf "$work"
}
trap cleanup EXIT
timeout 60 "$work/bin/duet-make-model" --preset tiny --seed 3 --out "$work/model" >> "$log" 2>&1 ||
  { echo "duet-make-model failed (missing libraries? see above)" >> "$log"; exit 3; }
prompt=$(seq -s, 5 44)  # 40 tokens: three blocks of 16
ref=$(timeout 60 "$duet" generate --model="$work/model" --device="$device" --prompt_ids="$prompt" \
  --max_tokens=16 2>> "$log" | od -An -tx1 | tr -d ' \n')
echo "one process:  $ref" >> "$log"
"$duet" serve --loopback --prefill=1 --decode=1 --model="$work/model" --device="$device" \
  --kv_staging="$staging" --threads=2 --kv_cache_bytes=67108864 > "$work/serve.out" 2>> "$log" &
serve_pid=$!
addr=
for _ in $(seq 600); do
  addr=$(awk '/^ready /{print $2; exit}' "$work/serve.out")
  [[ -n $addr ]] && break
  kill -0 "$serve_pid" 2> /dev/null || break
  sleep 0.1
done
if [[ -z $addr ]]; then
  { echo "the loopback cluster did not start:"; cat "$work/serve.out"; } >> "$log"
  exit 4
fi
got=$(timeout 60 "$duet" generate --server="$addr" --prompt_ids="$prompt" --max_tokens=16 \
  2>> "$log" | od -An -tx1 | tr -d ' \n')
echo "disaggregated: $got" >> "$log"
logs=$(sed -n 's/.*(logs in \([^)]*\)).*/\1/p' "$work/serve.out" | head -1)
[[ -n $logs ]] && grep -h -E "KV staged|compute backend|error|Error" "$logs"/*.log >> "$log" 2>&1
kill "$serve_pid" 2> /dev/null
wait "$serve_pid" 2> /dev/null
serve_pid=
[[ -n $logs ]] && rm -rf "$logs"
if [[ $device != cpu ]]; then
  never=$(timeout 60 "$duet" prefill --model="$work/model" --device="$device" --kv_staging=never \
    2>&1 | grep -c "kv_staging=never")
  echo "--kv_staging=never with a device pool refused: $([[ $never -gt 0 ]] && echo yes || echo NO)" >> "$log"
fi
if [[ -z $ref || $ref != "$got" ]]; then
  echo "MISMATCH (on cuda a cuBLAS shape change can flip a greedy choice: see README)" >> "$log"
  exit 1
fi
echo "tokens match" >> "$log"
