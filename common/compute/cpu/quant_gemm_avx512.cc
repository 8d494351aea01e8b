// QuantGemm's AVX-512 VNNI tile kernel (compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512vnni; run only where the CPU has them, see cpu_isa.h): one zmm covers a whole group
// of 16 outputs and vpdpbusd forms the int32 dot products, the arithmetic of quant_gemm.h
// exactly. Q8_0 codes are signed on both sides, vpdpbusd wants one unsigned operand: the
// activation codes are offset by 128 (x + 128 = x ^ 0x80 as a byte) and 128 * sum(w), one
// vpdpbusd per step shared by every row, is subtracted, which is exact in int32. Q5_x codes get
// their fifth bit from one 64-byte load per block: step s's low and high nibbles take bits 2s
// and 2s + 1 of each byte, shifted to bit 4 (16-bit shifts by at most 4 stay within a byte).
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

// Bit kBit (and those above it) of each byte of v moved to bit kTo: a 16-bit shift, so only the
// bits the caller then masks, which stay within their byte, are meaningful.
template <int kTo, int kBit>
inline __m512i BitTo(__m512i v) {
  if constexpr (kBit < kTo) return _mm512_slli_epi16(v, kTo - kBit);
  if constexpr (kBit > kTo) return _mm512_srli_epi16(v, kBit - kTo);
  return v;
}

template <QuantFormat F, int R>
void Tile(const QuantWeights& w, const QuantActs& a, int g0, int g1, const float* bias, float* y,
          int64_t ldy) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const __m512i bias128 = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  constexpr int kCodes = CodesOffset(F);
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
        __m512i fifth = _mm512_setzero_si512();
        if constexpr (HasFifthBit(F)) fifth = _mm512_loadu_si512(gb + FifthBitsOffset(F));
        auto step = [&]<int S>() {
          const __m512i v = _mm512_loadu_si512(codes + S * 64);
          __m512i lo = _mm512_and_si512(v, low4);
          __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
          if constexpr (HasFifthBit(F)) {
            // lo | (bit 2S at bit 4), hi | (bit 2S + 1 at bit 4): ternary logic A | (B & C).
            lo = _mm512_ternarylogic_epi32(lo, (BitTo<4, 2 * S>(fifth)), bit4, 0xf8);
            hi = _mm512_ternarylogic_epi32(hi, (BitTo<4, 2 * S + 1>(fifth)), bit4, 0xf8);
          }
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const int8_t* xq = a.q + r * a.ldq + b * 32 + 8 * S;
            isum[r] = _mm512_dpbusd_epi32(isum[r], lo, Broadcast32(xq));
            isum[r] = _mm512_dpbusd_epi32(isum[r], hi, Broadcast32(xq + 4));
          }
        };
        step.template operator()<0>();
        step.template operator()<1>();
        step.template operator()<2>();
        step.template operator()<3>();
        if constexpr (CodeOffset(F) != 0) {
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            isum[r] =
                _mm512_sub_epi32(isum[r], _mm512_set1_epi32(CodeOffset(F) * a.sum[r * a.ldb + b]));
          }
        }
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(gb)));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(a.d[r * a.ldb + b]));
        acc[r] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(isum[r]), acc[r]);
      }
      if constexpr (HasMin(F)) {
        const __m512 mw =
            _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(gb + MinsOffset())));
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

// Q6_K's and Q3_K's step per block (quant_gemm.h): each half's int32 sum, less the offset o
// times the activations' sum over that half, times its int8 scale under d and dx.
template <int kOffset, int R>
inline void AccumulateHalves(__m512 d, const uint8_t* gb, const QuantActs& a, int b,
                             const __m512i (&isum)[2][R], __m512 (&acc)[R]) {
  const __m128i sc0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(gb));
  const __m128i sc1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 16));
  const __m512 dw0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc0)));
  const __m512 dw1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc1)));
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const int32_t sum = a.sum[r * a.ldb + b], lo = a.sum_lo[r * a.ldb + b];
    const __m512 dx = _mm512_set1_ps(a.d[r * a.ldb + b]);
    const __m512i i0 = _mm512_sub_epi32(isum[0][r], _mm512_set1_epi32(kOffset * lo));
    const __m512i i1 = _mm512_sub_epi32(isum[1][r], _mm512_set1_epi32(kOffset * (sum - lo)));
    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw0, dx), _mm512_cvtepi32_ps(i0), acc[r]);
    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw1, dx), _mm512_cvtepi32_ps(i1), acc[r]);
  }
}

// The K-quants (quant_gemm.h): Q4_K as Q4_1 with dw = d * sc and m = dmin * m from its
// integers (exact), Q5_K likewise with Q5_x's fifth bits, Q6_K with the top two code bits
// merged from its high-bit vectors and one int32 sum per half of 16.
template <QuantFormat F, int R>
void TileK(const QuantWeights& w, const QuantActs& a, int g0, int g1, const float* bias, float* y,
           int64_t ldy) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const __m512i bits45 = _mm512_set1_epi8(0x30);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  constexpr bool kQ6 = F == QuantFormat::kQ6_K;
  alignas(64) float out[kQuantGroupRows];
  for (int g = g0; g < g1; ++g) {
    __m512 acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < w.blocks; ++b) {
      const uint8_t* gb = w.GroupBlock(g, b);
      const uint8_t* sup = w.Super(g, b);
      const uint8_t* codes = gb + CodesOffset(F);
      if constexpr (R <= 2) PrefetchAhead(w, gb);
      __m512i high[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
      if constexpr (kQ6) {
        high[0] = _mm512_loadu_si512(gb + KHighBitsOffset());
        high[1] = _mm512_loadu_si512(gb + KHighBitsOffset() + 64);
      } else if constexpr (HasFifthBit(F)) {
        high[0] = _mm512_loadu_si512(gb + KHighBitsOffset());
      }
      __m512i isum[2][R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) isum[0][r] = isum[1][r] = _mm512_setzero_si512();
      auto step = [&]<int S>() {
        const __m512i v = _mm512_loadu_si512(codes + S * 64);
        __m512i lo = _mm512_and_si512(v, low4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        if constexpr (kQ6) {
          constexpr int kField = 2 * (S % 2);
          // lo | (field bits at 4-5), hi likewise: ternary logic A | (B & C).
          lo = _mm512_ternarylogic_epi32(lo, (BitTo<4, 2 * kField>(high[S / 2])), bits45, 0xf8);
          hi = _mm512_ternarylogic_epi32(hi, (BitTo<4, 2 * kField + 2>(high[S / 2])), bits45, 0xf8);
        } else if constexpr (HasFifthBit(F)) {
          lo = _mm512_ternarylogic_epi32(lo, (BitTo<4, 2 * S>(high[0])), bit4, 0xf8);
          hi = _mm512_ternarylogic_epi32(hi, (BitTo<4, 2 * S + 1>(high[0])), bit4, 0xf8);
        }
        constexpr int kHalf = kQ6 ? S / 2 : 0;
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const int8_t* xq = a.q + r * a.ldq + b * 32 + 8 * S;
          isum[kHalf][r] = _mm512_dpbusd_epi32(isum[kHalf][r], lo, Broadcast32(xq));
          isum[kHalf][r] = _mm512_dpbusd_epi32(isum[kHalf][r], hi, Broadcast32(xq + 4));
        }
      };
      step.template operator()<0>();
      step.template operator()<1>();
      step.template operator()<2>();
      step.template operator()<3>();
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sup)));
      if constexpr (kQ6) {
        AccumulateHalves<CodeOffset(F), R>(d, gb, a, b, isum, acc);
      } else {
        const __m128i sc0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(gb));
        const __m128i sc1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 16));
        const __m512 dmin =
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sup + 32)));
        const __m512 dw = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc0)));
        const __m512 mw = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc1)));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(a.d[r * a.ldb + b])),
                                   _mm512_cvtepi32_ps(isum[0][r]), acc[r]);
          acc[r] = _mm512_fnmadd_ps(mw, _mm512_set1_ps(a.dsum[r * a.ldb + b]), acc[r]);
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

// Q2_K and Q3_K (quant_gemm.h): step s (4 k) takes the 2-bit field s % 4 of half s / 4's
// vector, Q3_K's third bit from bit s of its high-bit vector; one int32 sum per half.
template <QuantFormat F, int R>
void TileLowBit(const QuantWeights& w, const QuantActs& a, int g0, int g1, const float* bias,
                float* y, int64_t ldy) {
  const __m512i three = _mm512_set1_epi8(3);
  const __m512i bit2 = _mm512_set1_epi8(4);
  const __m512i low4 = _mm512_set1_epi32(0x0f);
  constexpr bool kQ3 = F == QuantFormat::kQ3_K;
  alignas(64) float out[kQuantGroupRows];
  for (int g = g0; g < g1; ++g) {
    __m512 acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < w.blocks; ++b) {
      const uint8_t* gb = w.GroupBlock(g, b);
      const uint8_t* sup = w.Super(g, b);
      const uint8_t* codes = gb + CodesOffset(F);
      if constexpr (R <= 2) PrefetchAhead(w, gb);
      const __m512i v[2] = {_mm512_loadu_si512(codes), _mm512_loadu_si512(codes + 64)};
      __m512i high = _mm512_setzero_si512();
      if constexpr (kQ3) high = _mm512_loadu_si512(gb + Q3HighBitsOffset());
      __m512i isum[2][R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) isum[0][r] = isum[1][r] = _mm512_setzero_si512();
      auto step = [&]<int S>() {
        __m512i c = _mm512_and_si512(_mm512_srli_epi16(v[S / 4], 2 * (S % 4)), three);
        // c | (bit S at bit 2): ternary logic A | (B & C).
        if constexpr (kQ3) c = _mm512_ternarylogic_epi32(c, (BitTo<2, S>(high)), bit2, 0xf8);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          isum[S / 4][r] =
              _mm512_dpbusd_epi32(isum[S / 4][r], c, Broadcast32(a.q + r * a.ldq + b * 32 + 4 * S));
        }
      };
      step.template operator()<0>();
      step.template operator()<1>();
      step.template operator()<2>();
      step.template operator()<3>();
      step.template operator()<4>();
      step.template operator()<5>();
      step.template operator()<6>();
      step.template operator()<7>();
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sup)));
      if constexpr (kQ3) {
        AccumulateHalves<CodeOffset(F), R>(d, gb, a, b, isum, acc);
      } else {
        const __m128i s0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(gb));
        const __m128i s1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 16));
        const __m512 dmin =
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sup + 32)));
        const __m512i e0 = _mm512_cvtepu8_epi32(s0), e1 = _mm512_cvtepu8_epi32(s1);
        const __m512i sc0 = _mm512_and_si512(e0, low4), m0 = _mm512_srli_epi32(e0, 4);
        const __m512i sc1 = _mm512_and_si512(e1, low4), m1 = _mm512_srli_epi32(e1, 4);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const int32_t sum = a.sum[r * a.ldb + b], lo = a.sum_lo[r * a.ldb + b];
          const __m512 dx = _mm512_set1_ps(a.d[r * a.ldb + b]);
          const __m512i scaled = _mm512_add_epi32(_mm512_mullo_epi32(isum[0][r], sc0),
                                                  _mm512_mullo_epi32(isum[1][r], sc1));
          const __m512i mins =
              _mm512_add_epi32(_mm512_mullo_epi32(m0, _mm512_set1_epi32(lo)),
                               _mm512_mullo_epi32(m1, _mm512_set1_epi32(sum - lo)));
          acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(scaled), acc[r]);
          acc[r] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dx), _mm512_cvtepi32_ps(mins), acc[r]);
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
    if constexpr (IsLowBit(F)) {
      TileLowBit<F, R>(w, a, g0, g1, bias, y, ldy);
    } else if constexpr (IsKQuant(F)) {
      TileK<F, R>(w, a, g0, g1, bias, y, ldy);
    } else {
      Tile<F, R>(w, a, g0, g1, bias, y, ldy);
    }
  }
};

}  // namespace

void QuantTileAvx512Vnni(const QuantWeights& w, const QuantActs& a, int rows, int g0, int g1,
                         const float* bias, float* y, int64_t ldy) {
  DispatchQuantTile<Avx512VnniKernel>(w, a, rows, g0, g1, bias, y, ldy);
}

}  // namespace duet::compute::cpu::internal
