#!/usr/bin/env bash
# OpenBLAS is loaded only when cpu_gemm 'openblas' is asked for (cpu/openblas.h): `duet
# generate` on the default GEMM never maps libopenblas or libgfortran, and `--cpu_gemm openblas`
# loads it and generates. Uses glibc's LD_DEBUG=files to see what the process loads.
#   openblas_on_demand_test.sh DUET_BIN MAKE_MODEL_BIN WORK_DIR
set -uo pipefail
DUET=$1 MAKE_MODEL=$2 WORK=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p "$WORK"
MODEL=$WORK/tiny
[ -f "$MODEL/config.json" ] || "$MAKE_MODEL" --preset tiny --seed 5 --out "$MODEL" >/dev/null ||
  fail "duet-make-model"
run() {  # run GEMM: generate 4 tokens; loader trace -> $WORK/GEMM.ld.*
  rm -f "$WORK/$1".ld.*
  LD_DEBUG=files LD_DEBUG_OUTPUT="$WORK/$1.ld" "$DUET" generate --model "$MODEL" \
    --prompt "hello there" --max-tokens 4 --temperature 0 --threads 1 --device cpu \
    --cpu_gemm "$1" >"$WORK/$1.out" 2>"$WORK/$1.err"
}
loaded() { cat "$WORK/$1".ld.* 2>/dev/null | grep -c "file=.*$2"; }

run invariant || { cat "$WORK/invariant.err" >&2; fail "--cpu_gemm invariant"; }
[ "$(loaded invariant libopenblas)" = 0 ] || fail "the invariant GEMM loaded OpenBLAS"
[ "$(loaded invariant libgfortran)" = 0 ] || fail "the invariant GEMM loaded libgfortran"

run openblas || { cat "$WORK/openblas.err" >&2; fail "--cpu_gemm openblas"; }
[ "$(loaded openblas libopenblas)" -ge 1 ] || fail "--cpu_gemm openblas did not load OpenBLAS"
[ -s "$WORK/openblas.out" ] || fail "--cpu_gemm openblas generated nothing"
echo "PASS"
