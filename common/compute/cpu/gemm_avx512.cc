// InvariantGemm's AVX-512 microkernel (compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512dq; called only where the CPU has them, see cpu_isa.h). A panel of 16 output
// features is one zmm vector: tiles of 12 rows x 2 panels (24 accumulators, 2 weight vectors
// and the broadcast row value in the 32 zmm registers) or, for 1..4 rows (decode), 4 panels so
// that 4..16 independent fma chains hide the FMA latency.
// GCC 12's avx512fintrin.h warns that its own _mm512_undefined_* placeholders may be used
// uninitialized; they are not read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <array>
#include <utility>

#include "common/compute/cpu/gemm_kernels.h"

namespace duet::compute::cpu::internal {
namespace {

constexpr int kRows = 12;       // MR at 1 or 2 panels
constexpr int kFewRows = 4;     // rows that take 4 panels
constexpr int kWidePanels = 4;  // NP for few rows

// MR rows x NP panels; acc[r][q] is panel q of row r. The row and panel loops are unrolled:
// the accumulators must stay in registers.
template <int MR, int NP>
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
#pragma GCC unroll 4
  for (int q = 0; q < NP; ++q) w[q] = t.w[q];
  const float* x = t.x;
  const int64_t ldx = t.ldx;
  for (int k = 0; k < t.kc; ++k) {
    __m512 b[NP];
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) b[q] = _mm512_load_ps(w[q] + k * kPanelCols);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * ldx + k]);
#pragma GCC unroll 4
      for (int q = 0; q < NP; ++q) acc[r][q] = _mm512_fmadd_ps(a, b[q], acc[r][q]);
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

template <int NP, int R>
constexpr Fn TileFor() {
  if constexpr (NP <= 2 || R <= kFewRows) {
    return &Tile<R, NP>;
  } else {
    return nullptr;  // not a tile of this kernel
  }
}

template <int NP, int... R>
constexpr std::array<Fn, kRows> RowTiles(std::integer_sequence<int, R...>) {
  return {{TileFor<NP, R + 1>()...}};
}

// kTiles[num_panels - 1][rows - 1].
constexpr std::array<std::array<Fn, kRows>, kWidePanels> kTiles = {
    RowTiles<1>(std::make_integer_sequence<int, kRows>()),
    RowTiles<2>(std::make_integer_sequence<int, kRows>()),
    RowTiles<3>(std::make_integer_sequence<int, kRows>()),
    RowTiles<4>(std::make_integer_sequence<int, kRows>())};

void RunTile(int rows, int num_panels, const GemmTile& t) {
  const Fn fn = rows >= 1 && rows <= kRows && num_panels >= 1 && num_panels <= kWidePanels
                    ? kTiles[num_panels - 1][rows - 1]
                    : nullptr;
  if (fn != nullptr) return fn(t);
  PortableGemmKernel().tile(rows, num_panels, t);  // a shape outside panels_for_rows: unused
}

}  // namespace

const GemmKernel& Avx512GemmKernel() {
  static const GemmKernel kernel{"avx512", kRows, {0, 4, 4, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2}, RunTile};
  return kernel;
}

}  // namespace duet::compute::cpu::internal
