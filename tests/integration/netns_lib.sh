# Sourced by the netns_*_test.sh scripts: a coordinator, a prefill node and a decode node, each
# in its own network namespace ("host"), joined by veth pairs to a bridge that lives in a fourth
# namespace (nothing is added to the machine's own network); KV moves over UCX tcp on eth0.
#   10.77.0.1 coordinator (gRPC :7000, HTTP :8000), 10.77.0.2 prefill-0, 10.77.0.3 decode-0.
# The switch port towards host i is "$(netns_port i)" in "$NS_SW" (1: C, 2: P, 3: D).
#
#   LOG_NAME=my_test; source netns_lib.sh
#   netns_init "$WORK"                  # exits 77 (ctest SKIP) without ip/curl/CAP_NET_ADMIN
#   netns_network; netns_model
#   DECODE_ARGS=(--kv_quarantine_bound 2s); netns_start_cluster; netns_wait_ready
#   PIDS+=($!)                          # anything else started: killed on exit
# Every process in PIDS is stopped and every namespace deleted on exit, failure included.
# shellcheck shell=bash

SKIP=77
log() { echo "[$LOG_NAME] $*"; }

# Prints the last lines of every log under $WORK and exits 1.
fail() {
  log "FAIL: $*"
  for f in "$WORK"/*.log; do
    [ -f "$f" ] || continue
    echo "--- $f"
    tail -20 "$f"
  done
  exit 1
}

netns_cleanup() {
  trap - EXIT
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  sleep 0.5
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
  for ns in "$NS_C" "$NS_P" "$NS_D" "$NS_SW"; do ip netns del "$ns" 2>/dev/null; done
}

# Checks the tools and the permission (exit 77 without), names the namespaces, arms the cleanup.
netns_init() {
  WORK=$1
  command -v ip >/dev/null || { log "SKIP: iproute2 (ip) is not installed"; exit $SKIP; }
  command -v curl >/dev/null || { log "SKIP: curl is not installed"; exit $SKIP; }
  TAG="d$$"
  NS_SW="${TAG}sw" NS_C="${TAG}c" NS_P="${TAG}p" NS_D="${TAG}d"
  PIDS=()
  if ! ip netns add "$NS_SW" 2>/dev/null; then
    log "SKIP: 'ip netns add' is not permitted here (needs root or CAP_NET_ADMIN)"
    exit $SKIP
  fi
  trap netns_cleanup EXIT
  mkdir -p "$WORK"
  rm -f "$WORK"/*.log
}

netns_port() { echo "${TAG}s$1"; }

netns_network() {
  ip -n "$NS_SW" link add br0 type bridge || fail "bridge"
  ip -n "$NS_SW" link set br0 up
  ip -n "$NS_SW" link set lo up
  local i=1 ns
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
}

# The tiny model, made once per work dir.
netns_model() {
  MODEL="$WORK/tiny"
  [ -f "$MODEL/config.json" ] || "$MAKE_MODEL" --preset tiny --seed 5 --out "$MODEL" >/dev/null ||
    fail "duet-make-model"
}

# One process per "host"; extra flags per role in the arrays COORD_ARGS, PREFILL_ARGS,
# DECODE_ARGS. Logs: $WORK/{coordinator,prefill,decode}.log.
netns_start_cluster() {
  ip netns exec "$NS_C" "$DUET" coordinator --listen 10.77.0.1:7000 --model "$MODEL" \
    --http_port 8000 --http_host 10.77.0.1 "${COORD_ARGS[@]}" >"$WORK/coordinator.log" 2>&1 &
  PIDS+=($!)
  local role ns ip
  for role in prefill decode; do
    if [ $role = prefill ]; then
      ns=$NS_P ip=10.77.0.2
      set -- "${PREFILL_ARGS[@]}"
    else
      ns=$NS_D ip=10.77.0.3
      set -- "${DECODE_ARGS[@]}"
    fi
    ip netns exec "$ns" "$DUET" $role --coordinator 10.77.0.1:7000 --listen "$ip:0" \
      --node_id "$role-0" --model "$MODEL" --transport tcp --ucx_net_devices eth0 --threads 1 \
      --kv_cache_bytes 16777216 "$@" >"$WORK/$role.log" 2>&1 &
    PIDS+=($!)
  done
}

# Until the coordinator's /health answers 200 (a live, usable prefill/decode pair), 60 s at most.
netns_wait_ready() {
  local _
  for _ in $(seq 1 300); do
    if ip netns exec "$NS_C" curl -sf http://10.77.0.1:8000/health >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.2
  done
  fail "the cluster did not become ready"
}
