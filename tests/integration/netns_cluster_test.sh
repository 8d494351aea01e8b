#!/usr/bin/env bash
# Multi-host test on one machine: the coordinator, a prefill node and a decode node each run in
# their own network namespace ("host"), joined by veth pairs to a bridge that lives in a fourth
# namespace (nothing is added to the machine's own network). KV moves over UCX tcp between
# namespaces. Checks that `duet generate --server` and the HTTP API give exactly the tokens of
# `duet generate` in one process. Exits 77 (ctest SKIP) without iproute2 or CAP_NET_ADMIN.
#   netns_cluster_test.sh DUET_BIN MAKE_MODEL_BIN WORK_DIR
set -uo pipefail
DUET=$1 MAKE_MODEL=$2
LOG_NAME=netns_cluster_test
# shellcheck source=netns_lib.sh
source "$(dirname "$0")/netns_lib.sh"
netns_init "$3"

# ---- The network (netns_lib.sh): 10.77.0.1 coordinator, .2 prefill, .3 decode, one bridge.
netns_network
netns_model

# ---- The cluster: one process per "host"; nodes move KV over UCX tcp on eth0.
netns_start_cluster
netns_wait_ready
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
