// InvariantGemm's AVX2 + FMA microkernel (compiled with -mavx2 -mfma -mf16c -mno-avx512f, so a
// -march=native build still runs AVX2 code here; called only where the CPU has them, see
// cpu_isa.h). A panel is two ymm vectors; tiles of 6 rows x 1 panel (12 accumulators) or, for
// few rows, 3 rows x 2 panels.
#include <immintrin.h>

#include "common/compute/cpu/gemm_kernels.h"

namespace duet::compute::cpu::internal {
namespace {

// MR rows x (NP * 16) columns; acc[r][v] is the 8-wide vector v of row r. The row and vector
// loops are unrolled: the accumulators must stay in registers.
template <int MR, int NP>
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
  const float* x = t.x;
  const int64_t ldx = t.ldx;
  for (int k = 0; k < t.kc; ++k) {
    __m256 b[kVecs];
    b[0] = _mm256_load_ps(w0 + k * kPanelCols);
    b[1] = _mm256_load_ps(w0 + k * kPanelCols + 8);
    if constexpr (NP == 2) {
      b[2] = _mm256_load_ps(w1 + k * kPanelCols);
      b[3] = _mm256_load_ps(w1 + k * kPanelCols + 8);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * ldx + k);
#pragma GCC unroll 8
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm256_fmadd_ps(a, b[v], acc[r][v]);
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

void RunTile(int rows, int num_panels, const GemmTile& t) {
  if (num_panels == 2) {
    switch (rows) {
      case 1:
        return Tile<1, 2>(t);
      case 2:
        return Tile<2, 2>(t);
      case 3:
        return Tile<3, 2>(t);
      default:
        break;
    }
  } else if (num_panels == 1) {
    switch (rows) {
      case 1:
        return Tile<1, 1>(t);
      case 2:
        return Tile<2, 1>(t);
      case 3:
        return Tile<3, 1>(t);
      case 4:
        return Tile<4, 1>(t);
      case 5:
        return Tile<5, 1>(t);
      case 6:
        return Tile<6, 1>(t);
      default:
        break;
    }
  }
  PortableGemmKernel().tile(rows, num_panels, t);  // a shape outside panels_for_rows: unused
}

}  // namespace

const GemmKernel& Avx2GemmKernel() {
  static const GemmKernel kernel{"avx2", 6, {0, 2, 2, 2, 1, 1, 1}, RunTile};
  return kernel;
}

}  // namespace duet::compute::cpu::internal
