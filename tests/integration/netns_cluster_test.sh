#!/usr/bin/env bash
# Multi-host test on one machine: the coordinator, a prefill node and a decode node each run in
# their own network namespace ("host"), joined by veth pairs to a bridge that lives in a fourth
# namespace (nothing is added to the machine's own network). KV moves over UCX tcp between
# namespaces. Checks that `duet generate --server` and the HTTP API give exactly the tokens of
# `duet generate` in one process. Exits 77 (ctest SKIP) without iproute2 or CAP_NET_ADMIN.
#   netns_cluster_test.sh DUET_BIN MAKE_MODEL_BIN WORK_DIR
set -uo pipefail
DUET=$1 MAKE_MODEL=$2 WORK=$3
SKIP=77
log() { echo "[netns_cluster_test] $*"; }

command -v ip >/dev/null || { log "SKIP: iproute2 (ip) is not installed"; exit $SKIP; }
command -v curl >/dev/null || { log "SKIP: curl is not installed"; exit $SKIP; }
TAG="d$$"
NS_SW="${TAG}sw" NS_C="${TAG}c" NS_P="${TAG}p" NS_D="${TAG}d"
if ! ip netns add "$NS_SW" 2>/dev/null; then
  log "SKIP: 'ip netns add' is not permitted here (needs root or CAP_NET_ADMIN)"
  exit $SKIP
fi

PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  sleep 0.5
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
  for ns in "$NS_C" "$NS_P" "$NS_D" "$NS_SW"; do ip netns del "$ns" 2>/dev/null; done
}
trap cleanup EXIT
fail() { log "FAIL: $*"; for f in "$WORK"/*.log; do echo "--- $f"; tail -20 "$f"; done; exit 1; }

# ---- The network: 10.77.0.1 coordinator, .2 prefill, .3 decode, one bridge.
ip -n "$NS_SW" link add br0 type bridge || fail "bridge"
ip -n "$NS_SW" link set br0 up
ip -n "$NS_SW" link set lo up
i=1
for ns in "$NS_C" "$NS_P" "$NS_D"; do
  ip netns add "$ns" || fail "netns add $ns"
  ip link add "${TAG}h$i" type veth peer name "${TAG}s$i" || fail "veth"
  ip link set "${TAG}h$i" netns "$ns"
  ip link set "${TAG}s$i" netns "$NS_SW"
  ip -n "$ns" link set "${TAG}h$i" name eth0
  ip -n "$ns" addr add "10.77.0.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n "$NS_SW" link set "${TAG}s$i" master br0
  ip -n "$NS_SW" link set "${TAG}s$i" up
  i=$((i + 1))
done

mkdir -p "$WORK"
MODEL="$WORK/tiny"
[ -f "$MODEL/config.json" ] || "$MAKE_MODEL" --preset tiny --seed 5 --out "$MODEL" >/dev/null ||
  fail "duet-make-model"

# ---- The cluster: one process per "host"; nodes move KV over UCX tcp on eth0.
ip netns exec "$NS_C" "$DUET" coordinator --listen 10.77.0.1:7000 --model "$MODEL" \
  --http_port 8000 --http_host 10.77.0.1 >"$WORK/coordinator.log" 2>&1 &
PIDS+=($!)
for role in prefill decode; do
  if [ $role = prefill ]; then ns=$NS_P ip=10.77.0.2; else ns=$NS_D ip=10.77.0.3; fi
  ip netns exec "$ns" "$DUET" $role --coordinator 10.77.0.1:7000 --listen "$ip:0" \
    --node_id "$role-0" --model "$MODEL" --transport tcp --ucx_net_devices eth0 --threads 1 \
    --kv_cache_bytes 16777216 >"$WORK/$role.log" 2>&1 &
  PIDS+=($!)
done
ready=0
for _ in $(seq 1 300); do
  if ip netns exec "$NS_C" curl -sf http://10.77.0.1:8000/health >/dev/null 2>&1; then
    ready=1
    break
  fi
  sleep 0.2
done
[ $ready = 1 ] || fail "the cluster did not become ready"
log "cluster ready across 3 namespaces"

# ---- Token-exactness: one process vs the cluster (gRPC and HTTP).
for prompt in "Hello from another host" "The quick brown fox jumps over the lazy dog"; do
  ref=$("$DUET" generate --model "$MODEL" --prompt "$prompt" --max-tokens 16 --temperature 0 \
        --threads 1 --json) || fail "local generate"
  ref_ids=$(echo "$ref" | python3 -c 'import json,sys; print(json.load(sys.stdin)["generated_ids"])')
  prompt_ids=$(echo "$ref" | python3 -c 'import json,sys; print(json.load(sys.stdin)["prompt_ids"])')
  got=$(ip netns exec "$NS_C" "$DUET" generate --server 10.77.0.1:7000 --prompt "$prompt" \
        --max-tokens 16 --temperature 0 --json) || fail "remote generate"
  got_ids=$(echo "$got" | python3 -c 'import json,sys; print(json.load(sys.stdin)["generated_ids"])')
  [ "$ref_ids" = "$got_ids" ] || fail "gRPC tokens differ: local $ref_ids, cluster $got_ids"
  body=$(python3 -c 'import json,sys; print(json.dumps({"prompt": json.loads(sys.argv[1]), "max_tokens": 16, "temperature": 0, "logprobs": 0}))' "$prompt_ids")
  http=$(ip netns exec "$NS_C" curl -sf http://10.77.0.1:8000/v1/completions -d "$body") ||
    fail "HTTP completion"
  ref_text=$(echo "$ref" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["text"]))')
  http_text=$(echo "$http" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["choices"][0]["text"]))')
  [ "$ref_text" = "$http_text" ] || fail "HTTP text differs: local $ref_text, cluster $http_text"
  log "token-exact across hosts: $ref_ids"
done
grep -q "tcp" "$WORK/prefill.log" || true
metrics=$(ip netns exec "$NS_C" curl -sf http://10.77.0.1:8000/metrics) || fail "metrics"
echo "$metrics" | grep -q '^duet_coordinator_requests_total{outcome="ok"} 4$' ||
  fail "metrics: expected 4 ok requests: $(echo "$metrics" | grep requests_total)"
log "PASS"
