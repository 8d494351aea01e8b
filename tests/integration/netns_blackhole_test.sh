#!/usr/bin/env bash
# A prefill<->decode link black-holed past --kv_quarantine_bound recovers when it returns
# (docs/design.md §4.4, §8.11). Coordinator, prefill and decode nodes in their own network
# namespaces (netns_lib.sh), KV over UCX tcp. With completions in flight, every packet between
# P and D is dropped (a tbf with a 1-byte queue under an htb class that a u32 filter on the
# peer's address picks, on both switch ports; coordinator<->node gRPC passes). The clients give
# up, D quarantines the transfers and, unanswered past the bound, fences P. Checked:
#   during the cut:  duet_decode_kv_fenced_senders >= 1 and /health names the fenced pair;
#   after the cut:   within RECOVER_S the gauge is 0, /health says "ok", completions succeed,
#                    then 10 consecutive completions succeed;
#   throughout:      /health's fenced pairs agree with D's gauge (both sampled every 0.2 s, a
#                    heartbeat's lag allowed, at most a tenth of the samples unread), and the
#                    coordinator never loses a node (coordinator<->node gRPC is not cut).
# Exits 77 (ctest SKIP) without iproute2, tc, curl, CAP_NET_ADMIN or sch_tbf/sch_htb/cls_u32.
#   netns_blackhole_test.sh DUET_BIN MAKE_MODEL_BIN WORK_DIR
# Env: HOLD_S (seconds the cut lasts past the fence, default 10), RECOVER_S (default 4).
set -uo pipefail
DUET=$1 MAKE_MODEL=$2
LOG_NAME=netns_blackhole_test
# shellcheck source=netns_lib.sh
source "$(dirname "$0")/netns_lib.sh"
BOUND=2s              # --kv_quarantine_bound on D
CLIENT_TIMEOUT_S=2    # the clients' timeout during the cut (then the transfer is abandoned)
HOLD_S=${HOLD_S:-10}
# After the link returns, the fence lifts once D's next ask (every second, over a fresh
# connection) reaches P and P answers: P closed its connection to D when its cancelled writes
# stayed stuck (so no answer waits for TCP's next retransmission on it, which backs off to about
# as long as the cut so far), and connects do not block D's UCX worker. Then a heartbeat
# (0.5 s) tells the coordinator.
RECOVER_S=${RECOVER_S:-4}
FENCE_WAIT_S=20       # from the cut to the fence, at most
HEALTH_LAG_S=1.5      # /health may trail D's gauge by this much (500 ms heartbeats)
CONSECUTIVE=10

command -v tc >/dev/null || { log "SKIP: tc is not installed"; exit $SKIP; }
netns_init "$3"
SAMPLES="$WORK/samples.txt"
: >"$SAMPLES"

netns_network
# The black hole needs htb, tbf and u32 in the kernel: try them on the switch port to C.
port=$(netns_port 1)
if ! ip netns exec "$NS_SW" tc qdisc add dev "$port" root handle 1: htb default 10 2>/dev/null ||
   ! ip netns exec "$NS_SW" tc class add dev "$port" parent 1: classid 1:20 htb rate 10gbit \
       2>/dev/null ||
   ! ip netns exec "$NS_SW" tc qdisc add dev "$port" parent 1:20 handle 20: tbf rate 8bit \
       burst 1540 limit 1 2>/dev/null ||
   ! ip netns exec "$NS_SW" tc filter add dev "$port" parent 1: protocol ip prio 1 u32 \
       match ip src 10.77.0.254/32 flowid 1:20 2>/dev/null; then
  log "SKIP: tc cannot build htb + tbf + u32 here (kernel without sch_htb, sch_tbf or cls_u32?)"
  exit $SKIP
fi
ip netns exec "$NS_SW" tc qdisc del dev "$port" root
netns_model

NOW() { date +%s.%N; }
T0=$(NOW)
since() { awk -v a="$1" -v b="$(NOW)" 'BEGIN { printf "%.2f", b - a }'; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a - b }'; }
within() { awk -v a="$1" -v b="$(NOW)" -v m="$2" 'BEGIN { exit !(b - a < m) }'; }  # $1 + $2 s

# ---- The cluster. D serves /metrics on 10.77.0.3:9100 (read from the coordinator's host).
DECODE_ARGS=(--kv_quarantine_bound "$BOUND" --metrics_port 9100 --metrics_host 10.77.0.3)
netns_start_cluster
netns_wait_ready
log "cluster ready across 3 namespaces"

BODY='{"prompt": "Hello from another host", "max_tokens": 8, "temperature": 0}'
# One completion through the coordinator's HTTP API; $1: client timeout (s). 0: a 200 with text.
complete() {
  local out
  out=$(ip netns exec "$NS_C" curl -s -m "$1" -w '\n%{http_code}' \
          http://10.77.0.1:8000/v1/completions -H 'Content-Type: application/json' \
          -d "$BODY" 2>/dev/null)
  [ "${out##*$'\n'}" = 200 ] && echo "$out" | grep -q '"text"'
}

# One sample: G (D's fenced-senders gauge, "?" if unread), HS (/health status), HF (fenced pairs
# /health names), NP/ND (live prefill/decode nodes); appended to $SAMPLES with the phase.
sample() {
  local m h _
  for _ in 1 2 3; do
    m=$(ip netns exec "$NS_C" curl -sf -m 1 http://10.77.0.3:9100/metrics 2>/dev/null) && break
  done
  G=$(echo "$m" | awk '$1 == "duet_decode_kv_fenced_senders" { print $2 + 0 }')
  G=${G:-?}
  for _ in 1 2 3; do
    h=$(ip netns exec "$NS_C" curl -s -m 1 http://10.77.0.1:8000/health 2>/dev/null)
    [ -n "$h" ] && break
  done
  HBODY=$h
  HS=$(echo "$h" | sed -n 's/.*"status":"\([a-z_]*\)".*/\1/p')
  HS=${HS:-?}
  HF=$(echo "$h" | grep -o 'has prefill-0[^"]* fenced' | wc -l)
  NP=$(echo "$h" | sed -n 's/.*"prefill_nodes":\([0-9]*\).*/\1/p')
  ND=$(echo "$h" | sed -n 's/.*"decode_nodes":\([0-9]*\).*/\1/p')
  echo "$(since "$T0") $1 $G $HS $HF ${NP:-?} ${ND:-?}" >>"$SAMPLES"
}
unread() { [ "$G" = "?" ] || [ "$HS" = "?" ]; }
fenced_now() { [ "$G" != "?" ] && [ "$G" -ge 1 ]; }
health_fenced() { [ "$HF" -ge 1 ] && { [ "$HS" = degraded ] || [ "$HS" = not_ready ]; }; }

complete 30 || fail "the first completion"
sample before
[ "$G" = 0 ] && [ "$HS" = ok ] && [ "$HF" = 0 ] ||
  fail "before the cut: gauge $G, /health $HS with $HF fenced pairs (want 0, ok, 0)"
log "a completion works; gauge 0, /health ok"

# ---- The cut: on the bridge, drop every IPv4 packet from P to D and from D to P. On the
# switch port towards each of them, an htb whose default class passes everything, and a class
# chosen by the peer's source address whose tbf (1-byte queue) drops everything.
blackhole() {  # $1: switch port index, $2: the source address to drop
  local dev
  dev=$(netns_port "$1")
  ip netns exec "$NS_SW" tc qdisc add dev "$dev" root handle 1: htb default 10 &&
  ip netns exec "$NS_SW" tc class add dev "$dev" parent 1: classid 1:10 htb rate 10gbit \
    2>/dev/null &&
  ip netns exec "$NS_SW" tc class add dev "$dev" parent 1: classid 1:20 htb rate 10gbit \
    2>/dev/null &&
  ip netns exec "$NS_SW" tc qdisc add dev "$dev" parent 1:20 handle 20: tbf rate 8bit \
    burst 1540 limit 1 &&
  ip netns exec "$NS_SW" tc filter add dev "$dev" parent 1: protocol ip prio 1 u32 \
    match ip src "$2/32" flowid 1:20
}
tbf_drops() {  # $1: switch port index
  ip netns exec "$NS_SW" tc -s qdisc show dev "$(netns_port "$1")" |
    awk '/^qdisc tbf/ { t = 1 } t && /dropped/ { gsub(/,/, ""); print $7; exit }'
}
LOADERS=()
stop_load() {
  local p
  for p in "${LOADERS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  LOADERS=()
}

blackhole 2 10.77.0.3 || fail "tc: the black hole towards P"
blackhole 3 10.77.0.2 || fail "tc: the black hole towards D"
T_CUT=$(NOW)
# Proof: TCP from P to D's /metrics goes nowhere, while the coordinator still reaches D.
ip netns exec "$NS_P" curl -s -m 1 -o /dev/null http://10.77.0.3:9100/metrics &&
  fail "the black hole lets TCP from P to D through"
ip netns exec "$NS_C" curl -s -m 1 -o /dev/null http://10.77.0.3:9100/metrics ||
  fail "the black hole cuts the coordinator off from D"
log "link P<->D black-holed (TCP P->D :9100 times out, C->D answers); completions in flight"

# Completions during the cut: the clients give up, the transfers are abandoned.
for _ in 1 2; do
  (while true; do complete "$CLIENT_TIMEOUT_S"; sleep 0.1; done) &
  LOADERS+=($!)
  PIDS+=($!)
done
T_FENCED=""
T_HEALTH_FENCED=""
while within "$T_CUT" "$FENCE_WAIT_S"; do
  sample cut
  if fenced_now && [ -z "$T_FENCED" ]; then T_FENCED=$(NOW); fi
  if health_fenced && [ -z "$T_HEALTH_FENCED" ]; then T_HEALTH_FENCED=$(NOW); fi
  [ -n "$T_FENCED" ] && [ -n "$T_HEALTH_FENCED" ] && break
  sleep 0.2
done
[ -n "$T_FENCED" ] ||
  { stop_load; fail "D did not fence P within ${FENCE_WAIT_S}s of the cut (gauge $G)"; }
[ -n "$T_HEALTH_FENCED" ] ||
  { stop_load; fail "/health did not report the fenced pair (status $HS, $HF pairs; gauge $G)"; }
log "/health during the cut: $HBODY"
log "fenced: gauge >= 1 after $(sub "$T_FENCED" "$T_CUT")s, /health $HS with the pair after" \
  "$(sub "$T_HEALTH_FENCED" "$T_CUT")s"
# Hold the cut: the fence cannot lift while P cannot answer, and /health keeps saying so.
T_HOLD=$(NOW)
while within "$T_HOLD" "$HOLD_S"; do
  sample hold
  unread && { sleep 0.2; continue; }
  fenced_now || { stop_load; fail "the fence lifted while the link was still cut (gauge $G)"; }
  health_fenced || { stop_load; fail "/health lost the fenced pair during the cut ($HS, $HF)"; }
  sleep 0.2
done
stop_load
DROPS_P=$(tbf_drops 2) DROPS_D=$(tbf_drops 3)
[ "${DROPS_P:-0}" -gt 0 ] && [ "${DROPS_D:-0}" -gt 0 ] ||
  fail "the tbf dropped nothing (towards P: $DROPS_P, towards D: $DROPS_D)"
log "cut held ${HOLD_S}s past the fence; tbf drops: $DROPS_P towards P, $DROPS_D towards D"

# ---- The link returns.
ip netns exec "$NS_SW" tc qdisc del dev "$(netns_port 2)" root || fail "tc del"
ip netns exec "$NS_SW" tc qdisc del dev "$(netns_port 3)" root || fail "tc del"
T_BACK=$(NOW)
log "link restored after $(sub "$T_BACK" "$T_CUT")s cut"
# A client that keeps trying from the moment the link returns: when does it first succeed?
rm -f "$WORK/first_ok"
(while ! complete 5; do sleep 0.2; done
 NOW >"$WORK/first_ok.t" && mv "$WORK/first_ok.t" "$WORK/first_ok") &
PIDS+=($!)
T_LIFTED="" T_HEALTH_OK=""
while within "$T_BACK" "$RECOVER_S"; do
  sample back
  [ -z "$T_LIFTED" ] && [ "$G" = 0 ] && T_LIFTED=$(NOW)
  [ -z "$T_HEALTH_OK" ] && [ "$HS" = ok ] && [ "$HF" = 0 ] && T_HEALTH_OK=$(NOW)
  [ -n "$T_LIFTED" ] && [ -n "$T_HEALTH_OK" ] && [ -f "$WORK/first_ok" ] && break
  sleep 0.2
done
grep -E "KV fence" "$WORK/decode.log" | sed 's/^/  decode: /' | tail -6
[ -n "$T_LIFTED" ] ||
  fail "the fence did not lift within ${RECOVER_S}s of the link's return (gauge $G, /health $HS)"
[ -n "$T_HEALTH_OK" ] ||
  fail "/health did not say ok within ${RECOVER_S}s of the link's return ($HS, $HF pairs)"
[ -f "$WORK/first_ok" ] || fail "no completion succeeded within ${RECOVER_S}s of the link's return"
T_FIRST=$(cat "$WORK/first_ok")
log "recovered: fence lifted (gauge 0) $(sub "$T_LIFTED" "$T_BACK")s after the link returned," \
  "/health ok after $(sub "$T_HEALTH_OK" "$T_BACK")s, first completion after" \
  "$(sub "$T_FIRST" "$T_BACK")s"

# ---- Consecutive completions, the gauge and /health staying clear.
for n in $(seq 1 "$CONSECUTIVE"); do
  complete 10 || fail "completion $n of $CONSECUTIVE after the link returned"
  sample after
  [ "$G" = 0 ] && [ "$HS" = ok ] && [ "$HF" = 0 ] ||
    fail "after completion $n: gauge $G, /health $HS with $HF fenced pairs"
done
log "$CONSECUTIVE/$CONSECUTIVE consecutive completions after the link returned"

# ---- Throughout: /health agrees with the gauge (but for a heartbeat's lag after the gauge
# changes), and the coordinator never lost a node.
if ! awk -v lag="$HEALTH_LAG_S" '
    { t = $1; g = $3; hs = $4; hf = $5; np = $6; nd = $7 }
    g == "?" || hs == "?" { unread++; next }
    np != 1 || nd != 1 { print "node count off: " $0; bad = 1 }
    { f = g >= 1; if (NR == 1 || f != pf) { changed = t; pf = f } }
    { hfen = (hf >= 1 && (hs == "degraded" || hs == "not_ready")); hok = (hf == 0 && hs == "ok") }
    (f && !hfen) || (!f && !hok) {
      if (t - changed > lag) { print "disagree " (t - changed) "s after a change: " $0; bad = 1 }
    }
    END { if (unread * 10 > NR) { print unread " of " NR " samples unread"; bad = 1 }; exit bad }
    ' "$SAMPLES"; then
  fail "/health and the gauge disagreed (samples: t phase gauge status pairs P D in $SAMPLES)"
fi
log "$(wc -l <"$SAMPLES") samples: /health agreed with the gauge throughout, 1 P + 1 D live"
log "timings: cut $(sub "$T_BACK" "$T_CUT")s; fenced $(sub "$T_FENCED" "$T_CUT")s into it;" \
  "after the return: lifted $(sub "$T_LIFTED" "$T_BACK")s, /health ok" \
  "$(sub "$T_HEALTH_OK" "$T_BACK")s, first success $(sub "$T_FIRST" "$T_BACK")s"
log "PASS"
