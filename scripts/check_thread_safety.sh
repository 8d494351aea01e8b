#!/usr/bin/env bash
# Runs clang's thread-safety analysis (ABSL_GUARDED_BY and friends; GCC ignores them) over the
# library's own translation units, syntax only, with the flags from the GCC build's compile
# database. Fails and lists the findings when there are any.
#   scripts/check_thread_safety.sh            # uses build/compile_commands.json
#   scripts/check_thread_safety.sh common/kv/block_pool.cc ...   # only these sources
#   DUET_BUILD_DIR=out scripts/check_thread_safety.sh
# Needs a configured build whose generated protobuf headers exist (ninja -C build duet_proto).
# Checked: every source of the repository (common/, transfer/, coordinator/, prefill_node/,
# decode_node/, cli/, proto/'s hand-written glue, and modules added later) except tests/, fuzz/,
# bench/, generated *.pb.cc, the build directory and CUDA sources.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${DUET_BUILD_DIR:-$ROOT/build}"
CLANG="${DUET_CLANG:-clang++-14}"
DB="$BUILD/compile_commands.json"
if [ ! -f "$DB" ]; then
  echo "check_thread_safety: $DB not found; configure the build first (scripts/build.sh)" >&2
  exit 2
fi
if ! command -v "$CLANG" >/dev/null; then
  echo "check_thread_safety: $CLANG not found (scripts/install_deps.sh installs clang)" >&2
  exit 2
fi

OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

# One file per translation unit, $OUT/args.N: its directory, then its clang arguments,
# NUL-separated.
python3 - "$ROOT" "$BUILD" "$DB" "$OUT" "$@" <<'EOF'
import json, os, shlex, sys

root, build, db, out = sys.argv[1:5]
only = {os.path.normpath(p) for p in sys.argv[5:]}
skip = {"tests", "fuzz", "bench", os.path.relpath(os.path.realpath(build), root).split(os.sep)[0]}
# Flags that carry over from GCC to clang; everything else (optimisation, debug info, warnings,
# GCC-only -f options) is dropped. Those taking a separate value are listed in `with_value`.
keep_prefix = ("-I", "-D", "-U", "-std=", "-march=", "-pthread", "-iquote", "-isystem")
with_value = {"-I", "-D", "-U", "-isystem", "-iquote", "-include"}
n = 0
for entry in json.load(open(db)):
    src = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
    rel = os.path.relpath(src, root)
    parts = rel.split(os.sep)
    if parts[0] in skip or parts[0] == ".." or not rel.endswith((".cc", ".cpp")) or ".pb." in rel:
        continue
    if "cuda" in parts[:-1] or (only and rel not in only):
        continue
    args = entry.get("arguments") or shlex.split(entry["command"])
    flags = []
    it = iter(args[1:])
    for a in it:
        if a in with_value:
            flags += [a, next(it)]
        elif a == "-o":
            next(it)
        elif a.startswith(keep_prefix):
            flags.append(a)
    flags += ["-fsyntax-only", "-Wno-everything", "-Wthread-safety", "-Werror=thread-safety",
              src]
    with open(os.path.join(out, "args.%d" % n), "w") as f:
        f.write(entry["directory"] + "\0" + "\0".join(flags))
    n += 1
if n == 0:
    sys.exit("check_thread_safety: no translation units selected")
EOF

run_one() {
  local file="$1" clang="$2"
  local -a argv
  mapfile -d '' argv <"$file"
  local dir="${argv[0]}"
  if ! (cd "$dir" && "$clang" "${argv[@]:1}") >"$file.log" 2>&1; then
    echo "failed" >"$file.failed"
  fi
}
export -f run_one

START=$(date +%s)
count=$(find "$OUT" -name 'args.*' | wc -l)
find "$OUT" -name 'args.*' -print0 |
  xargs -0 -P "${DUET_JOBS:-$(nproc)}" -I{} bash -c 'run_one "$1" "$2"' _ {} "$CLANG"
SECS=$(($(date +%s) - START))

failed=$(find "$OUT" -name '*.failed' | wc -l)
if [ "$failed" -ne 0 ]; then
  for f in "$OUT"/args.*.failed; do cat "${f%.failed}.log"; done
  echo "check_thread_safety: $failed of $count translation units have findings (${SECS}s)" >&2
  exit 1
fi
echo "check_thread_safety: $count translation units clean (${SECS}s)"
