// Batch-invariant float32 GEMM for the CPU backend: y[m, n] = x[m, k] * w[n, k]^T (+ bias[n]).
//
// Weights are packed once into column panels of kPanelCols output features: panel p holds
// w[p*16 .. p*16+15][0..k) as k consecutive groups of 16 floats (zero-padded past n). Every
// output element is accumulated as acc = fma(x[i][kk], w[j][kk], acc) for kk = 0, 1, ..., k-1
// starting from acc = 0, then acc + bias[j], in every code path (the AVX-512 and AVX2
// microkernels, the portable std::fma path, row and column remainders, K blocking: a partial
// accumulator is stored as a float and reloaded exactly). So a row's result never depends on M,
// on the row's position, on the other rows or on the thread count, and every CpuIsa path gives
// the same bits: nodes on different CPUs agree.
//
//   PackedWeights packed = PackWeights(w.data(), n, k);
//   InvariantGemm(&pool, x, m, packed, bias, y, isa);  // isa from ResolveCpuIsa (cpu_isa.h)
#pragma once

#include <cstdint>

#include "common/base/thread_pool.h"
#include "common/compute/cpu/aligned.h"
#include "common/compute/cpu/cpu_isa.h"

namespace duet::compute::cpu {

inline constexpr int kPanelCols = 16;  // output features per packed panel (NR)

struct PackedWeights {
  int n = 0;           // output features (rows of the HF weight)
  int k = 0;           // input features
  int num_panels = 0;  // ceil(n / kPanelCols)
  AlignedFloats data;  // [num_panels][k][kPanelCols]

  const float* Panel(int p) const {
    return data.get() + static_cast<int64_t>(p) * k * kPanelCols;
  }
};

// Packs w [n, k] row-major. Returns an empty (data == nullptr) result when allocation fails.
PackedWeights PackWeights(const float* w, int n, int k);

// The microkernel `isa` runs: "scalar" (portable std::fma), "avx2" or "avx512" (every
// avx512* path).
const char* GemmKernelName(CpuIsa isa);

// y [m, w.n] = x [m, w.k] * w^T (+ bias) with the microkernel of `isa`, which the CPU must run
// (ResolveCpuIsa checked it). pool may be null (runs on the calling thread).
void InvariantGemm(ThreadPool* pool, const float* x, int m, const PackedWeights& w,
                   const float* bias, float* y, CpuIsa isa);

}  // namespace duet::compute::cpu
