// QuantGemm's AVX-512 VNNI tile kernel (compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512vnni; run only where the CPU has them, see cpu_isa.h): one zmm covers a whole group
// of 16 outputs and vpdpbusd forms the int32 dot products, the arithmetic of quant_gemm.h
// exactly. Q8_0 codes are signed on both sides, vpdpbusd wants one unsigned operand: the
// activation codes are offset by 128 (x + 128 = x ^ 0x80 as a byte) and 128 * sum(w), one
// vpdpbusd per step shared by every row, is subtracted, which is exact in int32.
// GCC 12's avx512fintrin.h warns that its own _mm512_undefined_* placeholders (the pass-through
// operand of the unmasked conversions) may be used uninitialized; they are not read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstring>

#include "common/compute/cpu/quant_kernels.h"

namespace duet::compute::cpu::internal {
namespace {

// The row and step loops are unrolled (as in gemm.cc): their vectors must stay in registers.

inline __m512i Broadcast32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

template <QuantFormat F, int R>
void Tile(const QuantWeights& w, const QuantActs& a, int g0, int g1, const float* bias, float* y,
          int64_t ldy) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const __m512i bias128 = _mm512_set1_epi8(static_cast<char>(0x80));
  constexpr int kCodes = F == QuantFormat::kQ4_1 ? 64 : 32;
  alignas(64) float out[kQuantGroupRows];
  for (int g = g0; g < g1; ++g) {
    __m512 acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < w.blocks; ++b) {
      const uint8_t* gb = w.GroupBlock(g, b);
      const uint8_t* codes = gb + kCodes;
      if constexpr (R <= 2) PrefetchAhead(w, gb);
      __m512i isum[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) isum[r] = _mm512_setzero_si512();
      if constexpr (F == QuantFormat::kQ8_0) {
        __m512i wsum = _mm512_setzero_si512();  // 128 * sum of each output's codes
#pragma GCC unroll 8
        for (int s = 0; s < 8; ++s) {
          const __m512i wv = _mm512_loadu_si512(codes + s * 64);
          wsum = _mm512_dpbusd_epi32(wsum, bias128, wv);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const __m512i xu =
                _mm512_xor_si512(Broadcast32(a.q + r * a.ldq + b * 32 + 4 * s), bias128);
            isum[r] = _mm512_dpbusd_epi32(isum[r], xu, wv);
          }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) isum[r] = _mm512_sub_epi32(isum[r], wsum);
      } else {
#pragma GCC unroll 8
        for (int s = 0; s < 4; ++s) {
          const __m512i v = _mm512_loadu_si512(codes + s * 64);
          const __m512i lo = _mm512_and_si512(v, low4);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const int8_t* xq = a.q + r * a.ldq + b * 32 + 8 * s;
            isum[r] = _mm512_dpbusd_epi32(isum[r], lo, Broadcast32(xq));
            isum[r] = _mm512_dpbusd_epi32(isum[r], hi, Broadcast32(xq + 4));
          }
        }
        if constexpr (F == QuantFormat::kQ4_0) {
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            isum[r] = _mm512_sub_epi32(isum[r], _mm512_set1_epi32(8 * a.sum[r * a.ldb + b]));
          }
        }
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(gb)));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(a.d[r * a.ldb + b]));
        acc[r] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(isum[r]), acc[r]);
      }
      if constexpr (F == QuantFormat::kQ4_1) {
        const __m512 mw =
            _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(gb + 32)));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.dsum[r * a.ldb + b]), acc[r]);
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm512_store_ps(out, acc[r]);
      StoreGroupRow(out, g, w.n, bias, y + r * ldy);
    }
  }
}

struct Avx512VnniKernel {
  template <QuantFormat F, int R>
  static void Run(const QuantWeights& w, const QuantActs& a, int g0, int g1, const float* bias,
                  float* y, int64_t ldy) {
    Tile<F, R>(w, a, g0, g1, bias, y, ldy);
  }
};

}  // namespace

void QuantTileAvx512Vnni(const QuantWeights& w, const QuantActs& a, int rows, int g0, int g1,
                         const float* bias, float* y, int64_t ldy) {
  DispatchQuantTile<Avx512VnniKernel>(w, a, rows, g0, g1, bias, y, ldy);
}

}  // namespace duet::compute::cpu::internal
