// Internal to the AVX-512 GEMM translation units (gemm_avx512.cc, gemm_avx512_bf16.cc):
// InvariantGemm's AVX-512 microkernel, compiled into each for its own instruction set. A panel
// of 16 output features is one zmm vector: tiles of 8 rows x 3 panels or, for 1..4 rows
// (decode), 4 panels (kPanelsForRows). bf16 / f16 panels are widened to float32 in registers
// (vpmovzxwd + vpslld 16, vcvtph2ps) and then take the same fma chain; kBf16Pairs panels take
// one word of two k per step, on vdpbf16ps where the unit has AVX512_BF16 (kDpBf16) and on its
// two fmas otherwise (bf16_avx512.h).
// GCC 12's avx512fintrin.h warns that its own _mm512_undefined_* placeholders may be used
// uninitialized; they are not read.
#pragma once
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <array>
#include <utility>

#include "common/compute/cpu/bf16_avx512.h"
#include "common/compute/cpu/gemm_kernels.h"

namespace duet::compute::cpu::internal {
namespace {

constexpr int kRows = 8;        // MR
constexpr int kWidePanels = 4;  // the most panels of a tile
// Panels per tile for a tile of r rows: 8 x 3 (24 accumulators, 3 weight vectors and the
// broadcast row value in the 32 zmm registers; 8 row pointers stay in general registers), and
// 4 panels for 1..4 rows (decode) so that 4..16 independent fma chains hide the FMA latency.
constexpr std::array<int, kRows + 1> kPanelsForRows = {0, 4, 4, 4, 4, 3, 3, 3, 3};

// Step k of a panel slice, widened to float32 (gemm.h PanelType).
template <PanelType T>
inline __m512 LoadPanel(const float* w, const uint16_t* h, int k) {
  if constexpr (T == PanelType::kF32) {
    return _mm512_load_ps(w + k * kPanelCols);
  } else {
    const __m256i bits = _mm256_load_si256(reinterpret_cast<const __m256i*>(h + k * kPanelCols));
    if constexpr (T == PanelType::kBf16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    } else {
      return _mm512_cvtph_ps(bits);
    }
  }
}

// MR rows x NP panels; acc[r][q] is panel q of row r. The row and panel loops are unrolled:
// the accumulators must stay in registers.
template <PanelType T, int MR, int NP, bool kDpBf16>
void Tile(const GemmTile& t) {
  __m512 acc[MR][NP];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) {
      acc[r][q] =
          t.accumulate ? _mm512_loadu_ps(t.c + r * t.ldc + q * kPanelCols) : _mm512_setzero_ps();
    }
  }
  const float* w[NP];
  const uint16_t* h[NP];
#pragma GCC unroll 4
  for (int q = 0; q < NP; ++q) {
    w[q] = t.w[q];
    h[q] = t.h[q];
  }
  if constexpr (T == PanelType::kBf16Pairs) {
    // One word (two k) per step: 16 weight words a panel, the row's x word broadcast.
    const uint32_t* xp = t.xp;
    const int64_t ldxp = t.ldxp;
    const int words = (t.kc + 1) / 2;
    for (int i = 0; i < words; ++i) {
      __m512i b[NP];
#pragma GCC unroll 4
      for (int q = 0; q < NP; ++q) b[q] = _mm512_load_si512(h[q] + i * 2 * kPanelCols);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m512i a = _mm512_set1_epi32(static_cast<int>(xp[r * ldxp + i]));
#pragma GCC unroll 4
        for (int q = 0; q < NP; ++q) {
          if constexpr (kDpBf16) {
            acc[r][q] = _mm512_dpbf16_ps(acc[r][q], reinterpret_cast<const __m512bh&>(a),
                                         reinterpret_cast<const __m512bh&>(b[q]));
          } else {
            acc[r][q] = DotPairFmas(acc[r][q], a, b[q]);
          }
        }
      }
    }
  } else {
    const float* x = t.x;
    const int64_t ldx = t.ldx;
    for (int k = 0; k < t.kc; ++k) {
      __m512 b[NP];
#pragma GCC unroll 4
      for (int q = 0; q < NP; ++q) b[q] = LoadPanel<T>(w[q], h[q], k);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m512 a = _mm512_set1_ps(x[r * ldx + k]);
#pragma GCC unroll 4
        for (int q = 0; q < NP; ++q) acc[r][q] = _mm512_fmadd_ps(a, b[q], acc[r][q]);
      }
    }
  }
  if (t.bias != nullptr) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
      for (int q = 0; q < NP; ++q) {
        acc[r][q] = _mm512_add_ps(acc[r][q], _mm512_loadu_ps(t.bias + q * kPanelCols));
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) _mm512_storeu_ps(t.c + r * t.ldc + q * kPanelCols, acc[r][q]);
  }
}

using Fn = void (*)(const GemmTile&);

template <PanelType T, bool kDpBf16, int NP, int R>
constexpr Fn TileFor() {
  if constexpr (NP <= kPanelsForRows[R]) {
    return &Tile<T, R, NP, kDpBf16>;
  } else {
    return nullptr;  // not a tile of this kernel
  }
}

template <PanelType T, bool kDpBf16, int NP, int... R>
constexpr std::array<Fn, kRows> RowTiles(std::integer_sequence<int, R...>) {
  return {{TileFor<T, kDpBf16, NP, R + 1>()...}};
}

// Tiles<T>()[num_panels - 1][rows - 1].
template <PanelType T, bool kDpBf16>
constexpr std::array<std::array<Fn, kRows>, kWidePanels> Tiles() {
  return {RowTiles<T, kDpBf16, 1>(std::make_integer_sequence<int, kRows>()),
          RowTiles<T, kDpBf16, 2>(std::make_integer_sequence<int, kRows>()),
          RowTiles<T, kDpBf16, 3>(std::make_integer_sequence<int, kRows>()),
          RowTiles<T, kDpBf16, 4>(std::make_integer_sequence<int, kRows>())};
}

template <PanelType T, bool kDpBf16>
void RunTile(int rows, int num_panels, const GemmTile& t) {
  static constexpr std::array<std::array<Fn, kRows>, kWidePanels> kTiles = Tiles<T, kDpBf16>();
  const Fn fn = rows >= 1 && rows <= kRows && num_panels >= 1 && num_panels <= kWidePanels
                    ? kTiles[num_panels - 1][rows - 1]
                    : nullptr;
  if (fn != nullptr) return fn(t);
  // A shape outside panels_for_rows: unused.
  PortableGemmKernel().tile[static_cast<int>(T)](rows, num_panels, t);
}

// Bf16WordsPortable's words, sixteen at a time (the same integer rounding).
inline void Bf16WordsAvx512(const float* x, int k, uint32_t* words) {
  int i = 0;
  for (; 2 * i + 32 <= k; i += 16) {
    _mm512_storeu_si512(words + i, PackBf16Words(x + 2 * i));
  }
  Bf16WordsPortable(x + 2 * i, k - 2 * i, words + i);
}

// The kernel's table; kDpBf16: kBf16Pairs tiles on vdpbf16ps (a unit compiled with AVX512_BF16).
template <bool kDpBf16>
GemmKernel MakeAvx512Kernel(const char* name) {
  return GemmKernel{name,
                    kRows,
                    {kPanelsForRows[0], kPanelsForRows[1], kPanelsForRows[2], kPanelsForRows[3],
                     kPanelsForRows[4], kPanelsForRows[5], kPanelsForRows[6], kPanelsForRows[7],
                     kPanelsForRows[8]},
                    {RunTile<PanelType::kF32, kDpBf16>, RunTile<PanelType::kBf16, kDpBf16>,
                     RunTile<PanelType::kF16, kDpBf16>, RunTile<PanelType::kBf16Pairs, kDpBf16>},
                    Bf16WordsAvx512};
}

}  // namespace
}  // namespace duet::compute::cpu::internal
