# Sourced by the benchmark scripts: starts `duet serve --loopback` and waits until it is ready.
#
#   . "$ROOT/scripts/loopback_lib.sh"
#   loopback_inputs cancel        # checks $BUILD/cli/duet and $MODEL; sets DUET and OUT (a temp dir)
#   start_loopback "$DUET" "$OUT" --prefill 2 --decode 2 --model "$MODEL" --node_metrics
#   # $ADDR: the client address; $OUT/serve.out: its "metrics NODE URL" lines; stopped on EXIT
#
# And for scripts that start and stop several servers pinned to cores (their own traps):
#   start_pinned_server 0-1 "$LOG" --loopback ...   # sets SERVE_PID and ADDR, or returns 1
#   node_pid decode-0 "$LOG"; stop_pid "$SERVE_PID"
start_loopback() {
  local duet="$1" out="$2"
  shift 2
  "$duet" serve --loopback "$@" >"$out/serve.out" 2>"$out/serve.err" &
  SERVE=$!
  trap 'kill "$SERVE" 2>/dev/null; wait "$SERVE" 2>/dev/null || true' EXIT
  trap 'exit 130' INT TERM  # so that EXIT runs (and stops the cluster) when killed
  for _ in $(seq 1 600); do
    grep -q '^ready ' "$out/serve.out" && break
    kill -0 "$SERVE" 2>/dev/null || { cat "$out/serve.err" >&2; exit 1; }
    sleep 0.2
  done
  ADDR="$(awk '/^ready /{print $2}' "$out/serve.out")"
  [ -n "$ADDR" ] || { echo "$(basename "$0"): the cluster did not become ready" >&2; exit 1; }
}

loopback_inputs() {
  local me
  me="$(basename "$0")"
  DUET="$BUILD/cli/duet"
  [ -x "$DUET" ] || { echo "$me: $DUET not built" >&2; exit 2; }
  [ -e "$MODEL" ] || { echo "$me: no model at $MODEL (scripts/get_model.sh)" >&2; exit 2; }
  OUT="$(mktemp -d "/tmp/duet-$1-XXXXXX")"
}

# stop_pid PID: TERM, up to 10 s for it to stop (a loopback cluster stops its nodes), then KILL.
stop_pid() {
  local pid="$1"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# start_pinned_server CPUS LOG ARGS...: `$DUET serve ARGS` under taskset, output to LOG; waits
# (up to 180 s) for its "ready ADDR" line. Sets SERVE_PID and ADDR; returns 1 if it never came.
start_pinned_server() {
  local cpus="$1" log="$2"
  shift 2
  taskset -c "$cpus" "$DUET" serve "$@" >"$log" 2>&1 &
  SERVE_PID=$!
  ADDR=""
  for _ in $(seq 1 900); do
    ADDR="$(awk '/^ready /{print $2; exit}' "$log")"
    [ -n "$ADDR" ] && return 0
    kill -0 "$SERVE_PID" 2>/dev/null || break
    sleep 0.2
  done
  cat "$log" >&2
  echo "$(basename "$0"): the server did not become ready" >&2
  return 1
}

# node_pid NODE LOG: the pid of a loopback cluster's node, from its "node NAME pid PID" line.
node_pid() { awk -v n="$1" '$1=="node" && $2==n {print $4; exit}' "$2"; }
