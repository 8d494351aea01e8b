# Sourced by the benchmark scripts: starts `duet serve --loopback` and waits until it is ready.
#
#   . "$ROOT/scripts/loopback_lib.sh"
#   loopback_inputs cancel        # checks $BUILD/cli/duet and $MODEL; sets DUET and OUT (a temp dir)
#   start_loopback "$DUET" "$OUT" --prefill 2 --decode 2 --model "$MODEL" --node_metrics
#   # $ADDR: the client address; $OUT/serve.out: its "metrics NODE URL" lines; stopped on EXIT
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
