// Internal to the AVX-512 attention translation units (attention_avx512.cc,
// attention_avx512_bf16.cc): the AVX-512 F/BW lanes of attention_kernels_impl.h, 16 per vector,
// a 6 x 64 register tile, masked FMAs. Compiled into each unit for its own instruction set.
// GCC 12's avx512fintrin.h warns, where its inline functions are expanded, that its own
// _mm512_undefined_* placeholders (the pass-through operand of unmasked operations) may be used
// uninitialized; they are not read. Hence the pragmas over the whole file.
#pragma once
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "common/compute/cpu/attention_kernels_impl.h"
#include "common/compute/cpu/bf16_avx512.h"

namespace duet::compute::cpu::internal {
namespace {

struct Avx512Isa {
  static constexpr int kW = 16;
  static constexpr int kScoreRows = 6;
  static constexpr int kScoreUnits = 4;
  static constexpr int kAccRows = 6;
  static constexpr int kAccVecs = 4;
  using V = __m512;
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, V a) { _mm512_storeu_ps(p, a); }
  static V Set1(float x) { return _mm512_set1_ps(x); }
  static V Zero() { return _mm512_setzero_ps(); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  static V Exp(V x) {
    const V n = _mm512_roundscale_ps(_mm512_mul_ps(x, Set1(kExpLog2e)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm512_fmadd_ps(n, Set1(-kExpLn2Hi), x);
    r = _mm512_fmadd_ps(n, Set1(-kExpLn2Lo), r);
    V p = Set1(kExpP0);
    p = _mm512_fmadd_ps(p, r, Set1(kExpP1));
    p = _mm512_fmadd_ps(p, r, Set1(kExpP2));
    p = _mm512_fmadd_ps(p, r, Set1(kExpP3));
    p = _mm512_fmadd_ps(p, r, Set1(kExpP4));
    p = _mm512_fmadd_ps(p, r, Set1(kExpP5));
    const V z = _mm512_mul_ps(r, r);
    V y = _mm512_fmadd_ps(p, z, r);
    y = _mm512_add_ps(y, Set1(1.f));
    const __m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
    y = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(y), e));
    const __mmask16 small = _mm512_cmp_ps_mask(x, Set1(kExpMin), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(small, y, _mm512_setzero_ps());
  }
  static __mmask16 RangeMask(int lane0, int ja, int jb) {
    const int lo = std::max(ja - lane0, 0), hi = std::min(jb - lane0, kW - 1);
    if (lo > hi) return 0;
    return static_cast<__mmask16>((0xFFFFu << lo) & (0xFFFFu >> (kW - 1 - hi)));
  }
  static V KeepRange(V x, int lane0, int ja, int jb, V other) {
    return _mm512_mask_blend_ps(RangeMask(lane0, ja, jb), other, x);
  }
  static V FmaIf(bool on, V a, V b, V c) {
    return _mm512_mask3_fmadd_ps(a, b, c, static_cast<__mmask16>(on ? 0xFFFF : 0));
  }
  static float ReduceMax(V a) { return _mm512_reduce_max_ps(a); }
  // ScalarSumBlock's tree.
  static float SumBlock(const float* p) {
    const V a = _mm512_add_ps(_mm512_add_ps(Load(p), Load(p + 16)),
                              _mm512_add_ps(Load(p + 32), Load(p + 48)));
    const __m256 t =
        _mm256_add_ps(_mm512_castps512_ps256(a),
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
  }
  // 16 keys x 16 dims (floats or words): unpack pairs of rows (32-bit, then 64-bit), then gather
  // the 128-bit chunks of four rows' groups with two rounds of shuffle_f32x4.
  template <typename T>
  static void TransposeTile(const T* const* rows, int e0, T* out_words) {
    static_assert(sizeof(T) == 4);
    float* out = reinterpret_cast<float*>(out_words);
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i)
      r[i] = _mm512_loadu_ps(reinterpret_cast<const float*>(rows[i] + e0));
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
      const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
      const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
      r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
      r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
      r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
      r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    // r[4g + k] holds dims k, k + 4, k + 8, k + 12 (one per 128-bit chunk) of rows 4g..4g+3.
    for (int k = 0; k < 4; ++k) {
      const __m512 v0 = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x88);
      const __m512 v1 = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xDD);
      const __m512 w0 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x88);
      const __m512 w1 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xDD);
      _mm512_storeu_ps(out + k * kKeyBlock, _mm512_shuffle_f32x4(v0, w0, 0x88));
      _mm512_storeu_ps(out + (k + 8) * kKeyBlock, _mm512_shuffle_f32x4(v0, w0, 0xDD));
      _mm512_storeu_ps(out + (k + 4) * kKeyBlock, _mm512_shuffle_f32x4(v1, w1, 0x88));
      _mm512_storeu_ps(out + (k + 12) * kKeyBlock, _mm512_shuffle_f32x4(v1, w1, 0xDD));
    }
  }

  using W = __m512i;
  static W LoadW(const uint32_t* p) { return _mm512_loadu_si512(p); }
  static void StoreW(uint32_t* p, W a) { _mm512_storeu_si512(p, a); }
  static W Set1W(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
  static V DotPair(V acc, W a, W b) { return DotPairFmas(acc, a, b); }
  static W PackPairs(const float* p) { return PackBf16Words(p); }
  static void InterleaveTile(const uint16_t* r0, const uint16_t* r1, uint32_t* out) {
    const W a = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0)));
    const W b = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1)));
    StoreW(out, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
  }
};

}  // namespace
}  // namespace duet::compute::cpu::internal
