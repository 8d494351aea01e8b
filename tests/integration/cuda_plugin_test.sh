#!/usr/bin/env bash
# The CUDA backend is a plugin that `duet` loads only when it is picked (backend_plugin.h):
# `--device cpu`, and `--device auto` on a machine without a GPU driver, never map cudart or
# cuBLAS; `--device cuda` loads libduet_cuda_backend.so, whose every symbol must resolve
# against `duet` (it is opened with RTLD_NOW), and then either generates (a GPU is usable) or
# fails naming why no GPU is usable. Uses glibc's LD_DEBUG=files to see what the process loads.
# Exits 77 (ctest SKIP) for a build without the plugin.
#   cuda_plugin_test.sh DUET_BIN MAKE_MODEL_BIN WORK_DIR
set -uo pipefail
DUET=$1 MAKE_MODEL=$2 WORK=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
PLUGIN="$(dirname "$DUET")/../lib/libduet_cuda_backend.so"
[ -f "$PLUGIN" ] || { echo "no CUDA plugin in this build ($PLUGIN): skipped"; exit 77; }
mkdir -p "$WORK"
MODEL=$WORK/tiny
[ -f "$MODEL/config.json" ] || "$MAKE_MODEL" --preset tiny --seed 5 --out "$MODEL" >/dev/null ||
  fail "duet-make-model"
gpu=0
if [ -e /dev/nvidiactl ] || [ -e /dev/dxg ]; then gpu=1; fi

run() {  # run DEVICE: generate 4 tokens; stdout -> $WORK/DEVICE.out, loader trace -> .ld
  LD_DEBUG=files LD_DEBUG_OUTPUT="$WORK/$1.ld" "$DUET" generate --model "$MODEL" \
    --prompt "hello there" --max-tokens 4 --temperature 0 --threads 1 --device "$1" \
    >"$WORK/$1.out" 2>"$WORK/$1.err"
}
loaded() { cat "$WORK/$1".ld.* 2>/dev/null | grep -c "file=.*$2" ; }
rm -f "$WORK"/*.ld.*

run cpu || { cat "$WORK/cpu.err" >&2; fail "--device cpu"; }
[ "$(loaded cpu libcublas)" = 0 ] || fail "--device cpu loaded cuBLAS"
[ "$(loaded cpu libduet_cuda_backend)" = 0 ] || fail "--device cpu loaded the CUDA plugin"

run auto || { cat "$WORK/auto.err" >&2; fail "--device auto"; }
if [ $gpu = 0 ]; then
  [ "$(loaded auto libduet_cuda_backend)" = 0 ] ||
    fail "--device auto loaded the CUDA plugin on a machine without a GPU driver"
  cmp -s "$WORK/cpu.out" "$WORK/auto.out" || fail "--device auto generated other tokens than cpu"
fi

run cuda
rc=$?
[ "$(loaded cuda libduet_cuda_backend)" -ge 1 ] || fail "--device cuda did not load the plugin"
[ "$(loaded cuda libcublas)" -ge 1 ] || fail "--device cuda did not load cuBLAS"
grep -q "does not load\|registered no backend" "$WORK/cuda.err" &&
  fail "the plugin did not load: $(cat "$WORK/cuda.err")"
if [ $rc != 0 ]; then
  [ $gpu = 0 ] || fail "--device cuda failed on a machine with a GPU: $(cat "$WORK/cuda.err")"
  grep -q "no GPU is usable" "$WORK/cuda.err" ||
    fail "--device cuda failed without naming why: $(cat "$WORK/cuda.err")"
fi
echo "PASS (gpu driver: $gpu, --device cuda rc $rc)"
