// InvariantGemm's AVX2 + FMA microkernel (compiled with -mavx2 -mfma -mf16c -mno-avx512f, so a
// -march=native build still runs AVX2 code here; called only where the CPU has them, see
// cpu_isa.h). A panel is two ymm vectors; tiles of 6 rows x 1 panel (12 accumulators) or, for
// few rows, 3 rows x 2 panels. bf16 / f16 panels are widened to float32 in registers
// (vpmovzxwd + vpslld 16, vcvtph2ps) and then take the same fma chain; kBf16Pairs panels take
// one word of two k per step, on vdpbf16ps's two fmas (bf16_dot.h).
#include <immintrin.h>

#include "common/compute/cpu/gemm_kernels.h"

namespace duet::compute::cpu::internal {
namespace {

// Half v (8 floats) of step k of a panel slice, widened to float32 (gemm.h PanelType).
template <PanelType T>
inline __m256 LoadHalfPanel(const float* w, const uint16_t* h, int k, int v) {
  if constexpr (T == PanelType::kF32) {
    return _mm256_load_ps(w + k * kPanelCols + v * 8);
  } else {
    const __m128i bits =
        _mm_load_si128(reinterpret_cast<const __m128i*>(h + k * kPanelCols + v * 8));
    if constexpr (T == PanelType::kBf16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
    } else {
      return _mm256_cvtph_ps(bits);
    }
  }
}

// MR rows x (NP * 16) columns; acc[r][v] is the 8-wide vector v of row r. The row and vector
// loops are unrolled: the accumulators must stay in registers.
template <PanelType T, int MR, int NP>
void Tile(const GemmTile& t) {
  constexpr int kVecs = 2 * NP;
  __m256 acc[MR][kVecs];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kVecs; ++v) {
      acc[r][v] = t.accumulate ? _mm256_loadu_ps(t.c + r * t.ldc + v * 8) : _mm256_setzero_ps();
    }
  }
  const float* w0 = t.w[0];
  const float* w1 = t.w[NP - 1];
  const uint16_t* h0 = t.h[0];
  const uint16_t* h1 = t.h[NP - 1];
  if constexpr (T == PanelType::kBf16Pairs) {
    // One word (two k) per step; vdpbf16ps's two fmas, high halves first (bf16_dot.h).
    const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    const auto hi = [&](__m256i v) { return _mm256_castsi256_ps(_mm256_and_si256(v, high)); };
    const auto lo = [](__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); };
    const int words = (t.kc + 1) / 2;
    for (int i = 0; i < words; ++i) {
      __m256i b[kVecs];
#pragma GCC unroll 8
      for (int v = 0; v < kVecs; ++v) {
        const uint16_t* h = v < 2 ? h0 : h1;
        b[v] = _mm256_load_si256(
            reinterpret_cast<const __m256i*>(h + i * 2 * kPanelCols + (v % 2) * 16));
      }
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256i a = _mm256_set1_epi32(static_cast<int>(t.xp[r * t.ldxp + i]));
        const __m256 ahi = hi(a), alo = lo(a);
#pragma GCC unroll 8
        for (int v = 0; v < kVecs; ++v) {
          acc[r][v] = _mm256_fmadd_ps(alo, lo(b[v]), _mm256_fmadd_ps(ahi, hi(b[v]), acc[r][v]));
        }
      }
    }
  } else {
    const float* x = t.x;
    const int64_t ldx = t.ldx;
    for (int k = 0; k < t.kc; ++k) {
      __m256 b[kVecs];
      b[0] = LoadHalfPanel<T>(w0, h0, k, 0);
      b[1] = LoadHalfPanel<T>(w0, h0, k, 1);
      if constexpr (NP == 2) {
        b[2] = LoadHalfPanel<T>(w1, h1, k, 0);
        b[3] = LoadHalfPanel<T>(w1, h1, k, 1);
      }
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256 a = _mm256_broadcast_ss(x + r * ldx + k);
#pragma GCC unroll 8
        for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm256_fmadd_ps(a, b[v], acc[r][v]);
      }
    }
  }
  if (t.bias != nullptr) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < kVecs; ++v) {
        acc[r][v] = _mm256_add_ps(acc[r][v], _mm256_loadu_ps(t.bias + v * 8));
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kVecs; ++v) _mm256_storeu_ps(t.c + r * t.ldc + v * 8, acc[r][v]);
  }
}

template <PanelType T>
void RunTile(int rows, int num_panels, const GemmTile& t) {
  if (num_panels == 2) {
    switch (rows) {
      case 1:
        return Tile<T, 1, 2>(t);
      case 2:
        return Tile<T, 2, 2>(t);
      case 3:
        return Tile<T, 3, 2>(t);
      default:
        break;
    }
  } else if (num_panels == 1) {
    switch (rows) {
      case 1:
        return Tile<T, 1, 1>(t);
      case 2:
        return Tile<T, 2, 1>(t);
      case 3:
        return Tile<T, 3, 1>(t);
      case 4:
        return Tile<T, 4, 1>(t);
      case 5:
        return Tile<T, 5, 1>(t);
      case 6:
        return Tile<T, 6, 1>(t);
      default:
        break;
    }
  }
  PortableGemmKernel().tile[static_cast<int>(T)](rows, num_panels, t);  // a shape outside panels_for_rows: unused
}

}  // namespace

const GemmKernel& Avx2GemmKernel() {
  static const GemmKernel kernel{"avx2",
                                 6,
                                 {0, 2, 2, 2, 1, 1, 1},
                                 {RunTile<PanelType::kF32>, RunTile<PanelType::kBf16>,
                                  RunTile<PanelType::kF16>, RunTile<PanelType::kBf16Pairs>},
                                 Bf16WordsPortable};
  return kernel;
}

}  // namespace duet::compute::cpu::internal
