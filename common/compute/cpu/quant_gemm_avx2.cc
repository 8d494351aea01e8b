// QuantGemm's AVX2 tile kernel (compiled with -mavx2 -mfma -mf16c; run only where the CPU has
// them, see cpu_isa.h): vpmaddubsw / vpmaddwd integer dot products, the arithmetic of
// quant_gemm.h exactly. Q5_x codes take their fifth bit as the AVX-512 kernel does
// (quant_gemm_avx512.cc).
#include <immintrin.h>

#include <cstring>

#include "common/compute/cpu/quant_kernels.h"

namespace duet::compute::cpu::internal {
namespace {

// The row and step loops are unrolled (as in gemm.cc): their vectors must stay in registers.

inline __m256i Broadcast32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline int32_t HorizontalSum(__m256i v) {
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
  return _mm_cvtsi128_si32(s4);
}

// Bit kBit (and those above it) of each byte of v moved to bit kTo: a 16-bit shift, so only the
// bits the caller then masks, which stay within their byte, are meaningful.
template <int kTo, int kBit>
inline __m256i BitTo(__m256i v) {
  if constexpr (kBit < kTo) return _mm256_slli_epi16(v, kTo - kBit);
  if constexpr (kBit > kTo) return _mm256_srli_epi16(v, kBit - kTo);
  return v;
}

// Rows [0, R) x group g, half h (outputs 8h .. 8h+7), into out[r][8h ..].
template <QuantFormat F, int R>
void GroupHalf(const QuantWeights& w, const QuantActs& a, int g, int h,
               float out[][kQuantGroupRows]) {
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  constexpr int kCodes = CodesOffset(F);
  __m256 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int b = 0; b < w.blocks; ++b) {
    const uint8_t* gb = w.GroupBlock(g, b);
    const uint8_t* codes = gb + kCodes + h * 32;
    __m256i isum[R];
    if constexpr (F == QuantFormat::kQ8_0) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int s = 0; s < 8; ++s) {
        const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + s * 64));
        const __m256i aw = _mm256_abs_epi8(wv);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m256i xb = Broadcast32(a.q + r * a.ldq + b * 32 + 4 * s);
          const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xb, wv));
          isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, ones16));
        }
      }
    } else {
      __m256i fifth = _mm256_setzero_si256();
      if constexpr (HasFifthBit(F)) {
        fifth =
            _mm256_load_si256(reinterpret_cast<const __m256i*>(gb + FifthBitsOffset(F) + h * 32));
      }
      __m256i s16[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        isum[r] = _mm256_setzero_si256();
        s16[r] = _mm256_setzero_si256();
      }
      auto step = [&]<int S>() {
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + S * 64));
        __m256i lo = _mm256_and_si256(v, low4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        if constexpr (HasFifthBit(F)) {
          lo = _mm256_or_si256(lo, _mm256_and_si256(BitTo<4, 2 * S>(fifth), bit4));
          hi = _mm256_or_si256(hi, _mm256_and_si256(BitTo<4, 2 * S + 1>(fifth), bit4));
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const int8_t* xq = a.q + r * a.ldq + b * 32 + 8 * S;
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, Broadcast32(xq)),
                                             _mm256_maddubs_epi16(hi, Broadcast32(xq + 4)));
          s16[r] = _mm256_add_epi16(s16[r], p);
        }
        // |each product pair| <= 2 * 15 * 127 (Q5_x: 2 * 31 * 127): int16 holds 8 pairs of
        // four-bit codes (all four steps) or 4 pairs of five-bit ones (two steps).
        if constexpr (HasFifthBit(F) && S % 2 == 1) {
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(s16[r], ones16));
            s16[r] = _mm256_setzero_si256();
          }
        }
      };
      step.template operator()<0>();
      step.template operator()<1>();
      step.template operator()<2>();
      step.template operator()<3>();
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        if constexpr (!HasFifthBit(F)) isum[r] = _mm256_madd_epi16(s16[r], ones16);
        if constexpr (CodeOffset(F) != 0) {
          isum[r] =
              _mm256_sub_epi32(isum[r], _mm256_set1_epi32(CodeOffset(F) * a.sum[r * a.ldb + b]));
        }
      }
    }
    const __m256 dw =
        _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(gb + h * 16)));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(a.d[r * a.ldb + b]));
      acc[r] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(isum[r]), acc[r]);
    }
    if constexpr (HasMin(F)) {
      const __m256 mw = _mm256_cvtph_ps(
          _mm_load_si128(reinterpret_cast<const __m128i*>(gb + MinsOffset() + h * 16)));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.dsum[r * a.ldb + b]), acc[r]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r] + 8 * h, acc[r]);
}

// Q6_K's and Q3_K's step per block on output half h (quant_gemm.h): each half's int32 sum,
// less the offset o times the activations' sum over that half, times its int8 scale under d and
// dx.
template <int kOffset, int R>
inline void AccumulateHalves(__m256 d, const uint8_t* gb, int h, const QuantActs& a, int b,
                             const __m256i (&isum)[2][R], __m256 (&acc)[R]) {
  const __m128i sc0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(gb + 8 * h));
  const __m128i sc1 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(gb + 16 + 8 * h));
  const __m256 dw0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc0)));
  const __m256 dw1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc1)));
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const int32_t sum = a.sum[r * a.ldb + b], lo = a.sum_lo[r * a.ldb + b];
    const __m256 dx = _mm256_set1_ps(a.d[r * a.ldb + b]);
    const __m256i i0 = _mm256_sub_epi32(isum[0][r], _mm256_set1_epi32(kOffset * lo));
    const __m256i i1 = _mm256_sub_epi32(isum[1][r], _mm256_set1_epi32(kOffset * (sum - lo)));
    acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw0, dx), _mm256_cvtepi32_ps(i0), acc[r]);
    acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw1, dx), _mm256_cvtepi32_ps(i1), acc[r]);
  }
}

// The K-quants' half: Q4_K as Q4_1 with its scales from integers (dw = d * sc, m = dmin * m,
// both exact), Q5_K likewise with Q5_x's fifth bits; Q6_K with the top two code bits from its
// high-bit vectors and one int32 sum per half of 16. Five- and six-bit codes widen every step
// (|a step's product pairs| <= 2 * 2 * 63 * 127 fits int16, two steps may not).
template <QuantFormat F, int R>
void GroupHalfK(const QuantWeights& w, const QuantActs& a, int g, int h,
                float out[][kQuantGroupRows]) {
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  constexpr bool kQ6 = F == QuantFormat::kQ6_K;
  constexpr bool kWidenEachStep = kQ6 || HasFifthBit(F);
  __m256 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int b = 0; b < w.blocks; ++b) {
    const uint8_t* gb = w.GroupBlock(g, b);
    const uint8_t* sup = w.Super(g, b);
    const uint8_t* codes = gb + CodesOffset(F) + h * 32;
    __m256i high[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    if constexpr (kQ6) {
#pragma GCC unroll 2
      for (int i = 0; i < 2; ++i) {
        high[i] = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(gb + KHighBitsOffset() + i * 64 + h * 32));
      }
    } else if constexpr (HasFifthBit(F)) {
      high[0] =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + KHighBitsOffset() + h * 32));
    }
    __m256i isum[2][R], s16[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      isum[0][r] = isum[1][r] = s16[r] = _mm256_setzero_si256();
    }
    auto step = [&]<int S>() {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + S * 64));
      __m256i lo = _mm256_and_si256(v, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
      if constexpr (kQ6) {
        constexpr int kField = 2 * (S % 2);
        lo = _mm256_or_si256(lo, _mm256_and_si256(BitTo<4, 2 * kField>(high[S / 2]), bits45));
        hi = _mm256_or_si256(hi, _mm256_and_si256(BitTo<4, 2 * kField + 2>(high[S / 2]), bits45));
      } else if constexpr (HasFifthBit(F)) {
        lo = _mm256_or_si256(lo, _mm256_and_si256(BitTo<4, 2 * S>(high[0]), bit4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(BitTo<4, 2 * S + 1>(high[0]), bit4));
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const int8_t* xq = a.q + r * a.ldq + b * 32 + 8 * S;
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, Broadcast32(xq)),
                                           _mm256_maddubs_epi16(hi, Broadcast32(xq + 4)));
        if constexpr (kWidenEachStep) {
          constexpr int kHalf = kQ6 ? S / 2 : 0;
          isum[kHalf][r] = _mm256_add_epi32(isum[kHalf][r], _mm256_madd_epi16(p, ones16));
        } else {
          s16[r] = _mm256_add_epi16(s16[r], p);
        }
      }
    };
    step.template operator()<0>();
    step.template operator()<1>();
    step.template operator()<2>();
    step.template operator()<3>();
    const __m256 d =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sup + h * 16)));
    if constexpr (kQ6) {
      AccumulateHalves<CodeOffset(F), R>(d, gb, h, a, b, isum, acc);
    } else {
      const __m128i sc0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(gb + 8 * h));
      const __m128i sc1 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(gb + 16 + 8 * h));
      const __m256 dmin =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sup + 32 + h * 16)));
      const __m256 dw = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc0)));
      const __m256 mw = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc1)));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i i = kWidenEachStep ? isum[0][r] : _mm256_madd_epi16(s16[r], ones16);
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(a.d[r * a.ldb + b])),
                                 _mm256_cvtepi32_ps(i), acc[r]);
        acc[r] = _mm256_fnmadd_ps(mw, _mm256_set1_ps(a.dsum[r * a.ldb + b]), acc[r]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r] + 8 * h, acc[r]);
}

// Q2_K and Q3_K's half (quant_gemm.h): step s (4 k) takes the 2-bit field s % 4 of half s / 4's
// vector, Q3_K's third bit from bit s of its high-bit vector; a half's four steps sum in int16
// (|each| <= 2 * 7 * 127) and widen once.
template <QuantFormat F, int R>
void GroupHalfLowBit(const QuantWeights& w, const QuantActs& a, int g, int h,
                     float out[][kQuantGroupRows]) {
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i three = _mm256_set1_epi8(3);
  const __m256i bit2 = _mm256_set1_epi8(4);
  const __m256i low4 = _mm256_set1_epi32(0x0f);
  constexpr bool kQ3 = F == QuantFormat::kQ3_K;
  __m256 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int b = 0; b < w.blocks; ++b) {
    const uint8_t* gb = w.GroupBlock(g, b);
    const uint8_t* sup = w.Super(g, b);
    const uint8_t* codes = gb + CodesOffset(F) + h * 32;
    const __m256i v[2] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes)),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 64))};
    __m256i high = _mm256_setzero_si256();
    if constexpr (kQ3) {
      high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + Q3HighBitsOffset() + h * 32));
    }
    __m256i isum[2][R], s16[R];
    auto step = [&]<int S>() {
      __m256i c = _mm256_and_si256(_mm256_srli_epi16(v[S / 4], 2 * (S % 4)), three);
      if constexpr (kQ3) c = _mm256_or_si256(c, _mm256_and_si256(BitTo<2, S>(high), bit2));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i p = _mm256_maddubs_epi16(c, Broadcast32(a.q + r * a.ldq + b * 32 + 4 * S));
        if constexpr (S % 4 == 0) {
          s16[r] = p;
        } else {
          s16[r] = _mm256_add_epi16(s16[r], p);
        }
      }
      if constexpr (S % 4 == 3) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) isum[S / 4][r] = _mm256_madd_epi16(s16[r], ones16);
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
    const __m256 d =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sup + h * 16)));
    if constexpr (kQ3) {
      AccumulateHalves<CodeOffset(F), R>(d, gb, h, a, b, isum, acc);
    } else {
      const __m128i s0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(gb + 8 * h));
      const __m128i s1 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(gb + 16 + 8 * h));
      const __m256 dmin =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sup + 32 + h * 16)));
      const __m256i e0 = _mm256_cvtepu8_epi32(s0), e1 = _mm256_cvtepu8_epi32(s1);
      const __m256i sc0 = _mm256_and_si256(e0, low4), m0 = _mm256_srli_epi32(e0, 4);
      const __m256i sc1 = _mm256_and_si256(e1, low4), m1 = _mm256_srli_epi32(e1, 4);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const int32_t sum = a.sum[r * a.ldb + b], lo = a.sum_lo[r * a.ldb + b];
        const __m256 dx = _mm256_set1_ps(a.d[r * a.ldb + b]);
        const __m256i scaled = _mm256_add_epi32(_mm256_mullo_epi32(isum[0][r], sc0),
                                                _mm256_mullo_epi32(isum[1][r], sc1));
        const __m256i mins = _mm256_add_epi32(_mm256_mullo_epi32(m0, _mm256_set1_epi32(lo)),
                                              _mm256_mullo_epi32(m1, _mm256_set1_epi32(sum - lo)));
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(scaled), acc[r]);
        acc[r] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(mins), acc[r]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r] + 8 * h, acc[r]);
}

template <QuantFormat F, int R>
void Tile(const QuantWeights& w, const QuantActs& a, int g0, int g1, const float* bias, float* y,
          int64_t ldy) {
  alignas(32) float out[R][kQuantGroupRows];
  for (int g = g0; g < g1; ++g) {
    if constexpr (IsLowBit(F)) {
      GroupHalfLowBit<F, R>(w, a, g, 0, out);
      GroupHalfLowBit<F, R>(w, a, g, 1, out);
    } else if constexpr (IsKQuant(F)) {
      GroupHalfK<F, R>(w, a, g, 0, out);
      GroupHalfK<F, R>(w, a, g, 1, out);
    } else {
      GroupHalf<F, R>(w, a, g, 0, out);
      GroupHalf<F, R>(w, a, g, 1, out);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) StoreGroupRow(out[r], g, w.n, bias, y + r * ldy);
  }
}

struct Avx2Kernel {
  template <QuantFormat F, int R>
  static void Run(const QuantWeights& w, const QuantActs& a, int g0, int g1, const float* bias,
                  float* y, int64_t ldy) {
    Tile<F, R>(w, a, g0, g1, bias, y, ldy);
  }
};

}  // namespace

void QuantizeActivationRowAvx2(const float* x, int k, int8_t* q, float* d, int32_t* sum,
                               int32_t* sum_lo, float* dsum) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int b = 0; b < k / kQuantBlock; ++b) {
    const float* xb = x + b * kQuantBlock;
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    // As QuantizeActivationRow: x * (1 / d) rounded to nearest even, clamped to +-127.
    const float scale = amax / 127.f;
    const float inv = scale != 0.f ? 1.f / scale : 0.f;
    const __m256 vinv = _mm256_set1_ps(inv);
    __m256i c[4];
    __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      c[i] =
          _mm256_min_epi32(hi, _mm256_max_epi32(lo, _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vinv))));
      s = _mm256_add_epi32(s, c[i]);
    }
    // packs work within 128-bit lanes: the permute puts the 32 codes back in order.
    const __m256i packed = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3])), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kQuantBlock), packed);
    d[b] = scale;
    sum[b] = HorizontalSum(s);
    sum_lo[b] = HorizontalSum(_mm256_add_epi32(c[0], c[1]));
    const int32_t total = sum[b];
    dsum[b] = scale * static_cast<float>(total);
  }
}

void QuantTileAvx2(const QuantWeights& w, const QuantActs& a, int rows, int g0, int g1,
                   const float* bias, float* y, int64_t ldy) {
  DispatchQuantTile<Avx2Kernel>(w, a, rows, g0, g1, bias, y, ldy);
}

}  // namespace duet::compute::cpu::internal
