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
#include <vector>

#include "common/base/thread_pool.h"
#include "common/compute/cpu/aligned.h"
#include "common/compute/cpu/cpu_isa.h"

namespace duet::compute::cpu {

inline constexpr int kPanelCols = 16;  // output features per packed panel (NR)

// How packed panels hold their elements: float32, or 16 bits widened exactly to float32 in
// registers before the same fma chain (bf16: the bits shifted left by 16; f16: IEEE half as
// vcvtph2ps converts it, a signalling NaN quieted). So a GEMM over 16-bit panels equals the
// float32 GEMM over the widened weights bit for bit.
//
// kBf16Pairs is the other arithmetic, vdpbf16ps's (bf16_dot.h): bf16 weights kept in words of
// two consecutive k (panel p holds ceil(k / 2) groups of 16 words, [k / 2][16][2] in bf16, a
// zero past an odd k), and each row of x rounded to bf16 (nearest even, NaN quieted) into words
// the same way, once per call. Every output element is then acc = DotPair(acc, x word, w word)
// over the k pairs in order from acc = 0, then acc + bias: exact products, two roundings per
// pair, denormals flushed. It is batch- and thread-invariant and every path gives the same
// bits (the avx512_bf16 and amx paths run vdpbf16ps; the others its two fmas under
// DenormalsFlushed), but it is not the float32 GEMM's arithmetic: x loses its low 16 bits.
enum class PanelType { kF32, kBf16, kF16, kBf16Pairs };
const char* PanelTypeName(PanelType type);

struct PackedWeights {
  int n = 0;           // output features (rows of the HF weight)
  int k = 0;           // input features
  int num_panels = 0;  // ceil(n / kPanelCols)
  PanelType type = PanelType::kF32;
  AlignedFloats data;  // kF32: [num_panels][k][kPanelCols]
  AlignedHalfs halfs;  // kBf16 / kF16: the same layout, 16 bits per element; kBf16Pairs:
                       // [num_panels][ceil(k / 2)][kPanelCols][2]

  bool ok() const { return type == PanelType::kF32 ? data != nullptr : halfs != nullptr; }
  // Elements per panel (k rounded up to even for kBf16Pairs) x kPanelCols.
  int64_t PanelElems() const {
    return static_cast<int64_t>(type == PanelType::kBf16Pairs ? (k + 1) / 2 * 2 : k) * kPanelCols;
  }
  int64_t bytes() const { return num_panels * PanelElems() * (type == PanelType::kF32 ? 4 : 2); }
  const float* Panel(int p) const { return data.get() + p * PanelElems(); }
  const uint16_t* HalfPanel(int p) const { return halfs.get() + p * PanelElems(); }
};

// Packs w [n, k] row-major. Returns a result with !ok() when allocation fails.
PackedWeights PackWeights(const float* w, int n, int k);
// Packs w [n, k] of bf16 or f16 bits row-major, kept as they are. `type` is kBf16 or kF16
// (kF32 packs nothing: the result is !ok()).
PackedWeights PackWeights16(const uint16_t* w, int n, int k, PanelType type);
// Packs w [n, k] of bf16 bits row-major into kBf16Pairs panels.
PackedWeights PackWeightsBf16Pairs(const uint16_t* w, int n, int k);

// Row `row` (< w.n) of the matrix, widened to float32 as the GEMM sees it: out[0, w.k).
void UnpackRow(const PackedWeights& w, int row, float* out);

// The microkernel `isa` runs: "scalar" (portable std::fma), "avx2", "avx512" (avx512,
// avx512_vnni) or "avx512_bf16" (avx512_bf16, amx: the same, with kBf16Pairs on vdpbf16ps).
const char* GemmKernelName(CpuIsa isa);

// y [m, w.n] = x [m, w.k] * w^T (+ bias) with the microkernel of `isa`, which the CPU must run
// (ResolveCpuIsa checked it). pool may be null (runs on the calling thread).
// `words`: where kBf16Pairs products' rounded rows of x go (grown as needed, kept for the next
// call); null: a buffer of this call's own.
void InvariantGemm(ThreadPool* pool, const float* x, int m, const PackedWeights& w,
                   const float* bias, float* y, CpuIsa isa, std::vector<uint32_t>* words = nullptr);

// One product of InvariantGemmMany: y [m, w->n] = x * (*w)^T (+ bias).
struct GemmProduct {
  const PackedWeights* w = nullptr;
  const float* bias = nullptr;
  float* y = nullptr;
};

// Several products of the same x (every w->k equal) in one parallel pass: q, k and v (or gate
// and up) cost one fork and join instead of three. Each y is bitwise what InvariantGemm gives
// for it alone.
void InvariantGemmMany(ThreadPool* pool, const float* x, int m, const GemmProduct* products,
                       int count, CpuIsa isa, std::vector<uint32_t>* words = nullptr);

}  // namespace duet::compute::cpu
