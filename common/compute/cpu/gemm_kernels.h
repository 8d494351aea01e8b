// Internal to gemm.cc and its per-ISA translation units (gemm_avx2.cc, gemm_avx512.cc): the
// microkernels of InvariantGemm. A kernel computes one tile of `rows` x (num_panels * 16)
// outputs over a K slice of the packed panels; every output element is one fma chain over that
// slice in k order, continued from the stored tile when `accumulate`, then + bias (gemm.h). The
// driver in gemm.cc (blocking, threading, partial panels) is the same for every kernel; a kernel
// only says which tile shapes it runs (GemmKernel).
//
// Each per-ISA file keeps its code in an anonymous namespace: the same inline function compiled
// with other -m flags in two files would otherwise be one symbol, and the linker's pick could run
// AVX-512 instructions on the AVX2 path.
#pragma once

#include <bit>
#include <cstdint>

#include "common/base/float16.h"
#include "common/compute/cpu/bf16_dot.h"
#include "common/compute/cpu/gemm.h"

namespace duet::compute::cpu::internal {

inline constexpr int kMaxTileRows = 8;    // MR of the tallest kernel
inline constexpr int kMaxTilePanels = 4;  // NP of the widest kernel

struct GemmTile {
  const float* x;                  // first row, at column k0
  int64_t ldx;                     // x row stride
  const uint32_t* xp;              // kBf16Pairs: x's bf16 words (gemm.h), first row at word k0 / 2
  int64_t ldxp;                    // xp row stride in words
  const float* w[kMaxTilePanels];     // kF32 panel slices at k0 (entries past num_panels unused)
  const uint16_t* h[kMaxTilePanels];  // kBf16 / kF16 / kBf16Pairs panel slices at k0
  int kc;                             // K slice length (kBf16Pairs: ceil(kc / 2) words)
  float* c;                        // output tile (y or a scratch tile)
  int64_t ldc;
  bool accumulate;    // false: start from 0; true: continue from the stored c
  const float* bias;  // num_panels * 16 floats added at the end, or nullptr
};

// Computes a tile of `rows` (1..max_rows) x `num_panels` (1..panels_for_rows[rows]) panels.
using GemmTileFn = void (*)(int rows, int num_panels, const GemmTile& t);

struct GemmKernel {
  const char* name;
  int max_rows;                           // rows per tile (MR)
  int panels_for_rows[kMaxTileRows + 1];  // panels per tile for a tile of r rows (r >= 1)
  GemmTileFn tile[4];                     // by PanelType: kF32, kBf16, kF16, kBf16Pairs
  // kBf16Pairs: words[i] = Bf16Word(x[2i], x[2i + 1]) for i < ceil(k / 2), x[k] read as 0.
  void (*bf16_words)(const float* x, int k, uint32_t* words);
};

// The element of a 16-bit panel widened to float32, as the vector kernels do it.
inline float WidenBf16(uint16_t bits) { return Bf16ToFloat(bits); }
inline float WidenF16(uint16_t bits) {
  const float f = HalfToFloat(bits);
  // vcvtph2ps quiets a signalling NaN (sets the top mantissa bit).
  return f != f ? std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 0x00400000u) : f;
}

// std::fma per element: the reference the others equal bit for bit (gemm.cc).
const GemmKernel& PortableGemmKernel();
// AVX2 + FMA, 6 x 16 or 3 x 32 tiles of ymm accumulators (gemm_avx2.cc).
const GemmKernel& Avx2GemmKernel();
// AVX-512F, 8 x 48 or 4 x 64 tiles of zmm accumulators (gemm_avx512.cc).
const GemmKernel& Avx512GemmKernel();
// The AVX-512F kernel with kBf16Pairs tiles on vdpbf16ps (AVX512_BF16, gemm_avx512_bf16.cc).
const GemmKernel& Avx512Bf16GemmKernel();

// Bf16Word over a row, one element at a time (the portable kernel's bf16_words).
void Bf16WordsPortable(const float* x, int k, uint32_t* words);

}  // namespace duet::compute::cpu::internal
