#!/usr/bin/env bash
# The GPU check, in one call on a host with an NVIDIA GPU (CUDA, CMake and ninja there; Abseil,
# GoogleTest, gRPC, UCX and a network not needed). From the repository root, after
# tests/gpu/pack_offline_deps.sh filled .offline_deps and it was copied along with the checkout:
#
#   tests/gpu/run_device_checks.sh            # writes under $OUT (or /tmp/duet-gpu-out)
#
# 1. builds the engine only (-DDUET_ENGINE_ONLY=ON: common/ + the CUDA backend, sm_90) against
#    the packed Abseil/GoogleTest/nlohmann-json;
# 2. runs the gpu-labelled tests (kernels vs the CPU backend, f32/f16/bf16/int8/fp8 KV,
#    whole-model parity, KV staging pool <-> pinned host mirror through
#    ComputeBackend::CopyKvToHost/CopyKvFromHost);
# 3. times prefill (512/2048/8192 tokens) and decode (batch 1/32/128) on a random Llama-3-8B
#    geometry model plus the staged copy bandwidth through CopyKvToHost/CopyKvFromHost (device
#    pool <-> pinned host mirror, the nodes' --kv_staging path): engine.md and engine.json;
# 4. if .offline_deps/cluster.tar.xz is present (tests/gpu/pack_offline_cluster.sh) and time is
#    left, runs tests/gpu/run_cluster_check.sh: `duet serve --loopback --device=cuda` with KV
#    staged through host mirrors against `duet generate --device=cuda` (summary.txt);
# 5. if time is left, runs the kernel tests under compute-sanitizer memcheck.
# Stays under 8 minutes: every step has its own timeout. Files in $OUT (at most 8):
# summary.txt env.txt configure.log build.log gpu_tests.log bench.log engine.md engine.json
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-${1:-/tmp/duet-gpu-out}}
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/summary.txt"; }
left() { echo $((420 - ($(date +%s) - T0))); }  # seconds left of a 7-minute plan

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -2
  cmake --version | head -1
  ninja --version
  c++ --version | head -1
  ldd --version | head -1
  nproc
} > "$OUT/env.txt" 2>&1
say "env: $(grep -m1 -i 'h[0-9]\|nvidia' "$OUT/env.txt" | head -1)"

OFFLINE=$PWD/.offline_deps/prefix
if [[ ! -d $OFFLINE ]]; then
  say "FAIL: .offline_deps/prefix missing: run tests/gpu/pack_offline_deps.sh here first and copy .offline_deps along"
  exit 2
fi
LIBDIR=$OFFLINE/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CMAKE_POLICY_VERSION_MINIMUM=3.5
BUILD=${BUILD_DIR:-build-gpu}

# -include cstdint: Abseil 20220623's headers predate GCC 13's leaner includes (harmless here).
timeout 120 cmake -G Ninja -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDUET_ENGINE_ONLY=ON \
  -DDUET_CUDA_ARCHS=90 -Dabsl_DIR="$LIBDIR/cmake/absl" -DGTest_DIR="$LIBDIR/cmake/GTest" \
  -Dnlohmann_json_DIR="$OFFLINE/usr/share/cmake/nlohmann_json" \
  -DCMAKE_CXX_FLAGS="-include cstdint" > "$OUT/configure.log" 2>&1
rc=$?
say "configure rc=$rc"
if [[ $rc -ne 0 ]]; then tail -30 "$OUT/configure.log"; exit 3; fi

timeout 240 ninja -C "$BUILD" -j"$(nproc)" cuda_kernels_test cuda_sampling_test cuda_model_test gpu_engine_bench \
  > "$OUT/build.log" 2>&1
rc=$?
say "build rc=$rc ($(grep -c 'Building' "$OUT/build.log") compile steps)"
if [[ $rc -ne 0 ]]; then grep -E 'error|FAILED' "$OUT/build.log" | head -40; exit 4; fi
if command -v cuobjdump > /dev/null; then
  say "SASS: $(cuobjdump --dump-sass "$BUILD/common/compute/cuda/libduet_compute_cuda.a" 2>/dev/null |
    grep -cE 'HMMA') HMMA instructions in the CUDA backend (tensor-core prefill, expected > 0)"
fi

(cd "$BUILD" && timeout 150 ctest -L gpu --output-on-failure --timeout 120) > "$OUT/gpu_tests.log" 2>&1
rc=$?
say "gpu tests rc=$rc: $(grep -E 'tests passed|tests failed' "$OUT/gpu_tests.log" | tail -1)"
grep -E '\(Failed\)|\(Skipped\)|\(Timeout\)' "$OUT/gpu_tests.log" | head -20 | tee -a "$OUT/summary.txt"

budget=$(left)
# Leave the cluster step (below) its 90 s when its pack is present.
[[ -f $PWD/.offline_deps/cluster.tar.xz ]] && budget=$((budget - 100))
if [[ $budget -gt 60 ]]; then
  timeout $((budget - 30)) "$BUILD/bench/gpu/gpu_engine_bench" --preset llama3-8b \
    --prefill_attention simt,tensor \
    --prefill 512,2048,8192 --decode_batch 1,32,128 --context 1024 --reps 5 \
    --json "$OUT/engine.json" --table "$OUT/engine.md" > "$OUT/bench.log" 2>&1
  say "bench rc=$?"
else
  say "bench skipped: ${budget}s left"
fi

# Optional: the disaggregated cluster with GPU KV pools staged through host mirrors
# (tests/gpu/pack_offline_cluster.sh packed a prebuilt duet and its runtime libraries).
CLUSTER=$PWD/.offline_deps/cluster.tar.xz
budget=$(left)
if [[ -f $CLUSTER && $budget -gt 60 ]]; then
  cdir=$(mktemp -d)
  timeout 90 tests/gpu/run_cluster_check.sh "$CLUSTER" "$cdir" cuda auto
  say "cluster (duet serve --loopback --device=cuda --kv_staging=auto) rc=$? (0: tokens match)"
  sed 's/^/  /' "$cdir/cluster.log" | head -20 | tee -a "$OUT/summary.txt"
  rm -rf "$cdir"
elif [[ -f $CLUSTER ]]; then
  say "cluster skipped: ${budget}s left"
fi

budget=$(left)
if [[ $budget -gt 60 ]] && command -v compute-sanitizer > /dev/null; then
  timeout $((budget - 20)) compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BUILD/tests/gpu/cuda_kernels_test" --gtest_brief=1 >> "$OUT/gpu_tests.log" 2>&1
  say "memcheck of cuda_kernels_test rc=$? (9: memory errors, 124: out of time)"
fi

echo; cat "$OUT/summary.txt"; echo; cat "$OUT/bench.log" 2>/dev/null | tail -30
