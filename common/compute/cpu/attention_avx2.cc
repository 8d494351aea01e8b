// The attention block kernels on AVX2 + FMA (compiled with -mavx2 -mfma; run only where the
// CPU has them, cpu_isa.h): 8 lanes per vector, the operations of attention_kernels.h per lane.
#include <immintrin.h>

#include "common/compute/cpu/attention_kernels_impl.h"

namespace duet::compute::cpu::internal {
namespace {

struct Avx2Isa {
  static constexpr int kW = 8;
  static constexpr int kScoreRows = 6;
  static constexpr int kScoreUnits = 1;
  static constexpr int kAccRows = 6;
  static constexpr int kAccVecs = 2;
  using V = __m256;
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, V a) { _mm256_storeu_ps(p, a); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V Zero() { return _mm256_setzero_ps(); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V Exp(V x) {
    const V n = _mm256_round_ps(_mm256_mul_ps(x, Set1(kExpLog2e)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm256_fmadd_ps(n, Set1(-kExpLn2Hi), x);
    r = _mm256_fmadd_ps(n, Set1(-kExpLn2Lo), r);
    V p = Set1(kExpP0);
    p = _mm256_fmadd_ps(p, r, Set1(kExpP1));
    p = _mm256_fmadd_ps(p, r, Set1(kExpP2));
    p = _mm256_fmadd_ps(p, r, Set1(kExpP3));
    p = _mm256_fmadd_ps(p, r, Set1(kExpP4));
    p = _mm256_fmadd_ps(p, r, Set1(kExpP5));
    const V z = _mm256_mul_ps(r, r);
    V y = _mm256_fmadd_ps(p, z, r);
    y = _mm256_add_ps(y, Set1(1.f));
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    y = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), e));
    const V small = _mm256_cmp_ps(x, Set1(kExpMin), _CMP_LT_OQ);
    return _mm256_blendv_ps(y, _mm256_setzero_ps(), small);
  }
  static V KeepRange(V x, int lane0, int ja, int jb, V other) {
    const __m256i idx =
        _mm256_add_epi32(_mm256_set1_epi32(lane0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i below = _mm256_cmpgt_epi32(_mm256_set1_epi32(ja), idx);
    const __m256i above = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(jb));
    const __m256 out = _mm256_castsi256_ps(_mm256_or_si256(below, above));
    return _mm256_blendv_ps(x, other, out);
  }
  static V FmaIf(bool on, V a, V b, V c) { return on ? _mm256_fmadd_ps(a, b, c) : c; }
  static float ReduceMax(V a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
  }
  // ScalarSumBlock's tree: lo / hi hold lanes 0-7 / 8-15 of the 16-lane group sum.
  static float SumBlock(const float* p) {
    const V lo = _mm256_add_ps(_mm256_add_ps(Load(p), Load(p + 16)),
                               _mm256_add_ps(Load(p + 32), Load(p + 48)));
    const V hi = _mm256_add_ps(_mm256_add_ps(Load(p + 8), Load(p + 24)),
                               _mm256_add_ps(Load(p + 40), Load(p + 56)));
    const V t = _mm256_add_ps(lo, hi);
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
  }
  // 8 keys x 8 dims (floats or words): unpack pairs of rows, shuffle 64-bit pairs, swap 128-bit
  // halves.
  template <typename T>
  static void TransposeTile(const T* const* rows, int e0, T* out_words) {
    static_assert(sizeof(T) == 4);
    float* out = reinterpret_cast<float*>(out_words);
    __m256 r[8], t[8], u[8];
    for (int i = 0; i < 8; ++i)
      r[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(rows[i] + e0));
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
      u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
      u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
      u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
      u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      _mm256_storeu_ps(out + c * kKeyBlock, _mm256_permute2f128_ps(u[c], u[4 + c], 0x20));
      _mm256_storeu_ps(out + (c + 4) * kKeyBlock, _mm256_permute2f128_ps(u[c], u[4 + c], 0x31));
    }
  }

  using W = __m256i;
  static W LoadW(const uint32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const W*>(p)); }
  static void StoreW(uint32_t* p, W a) { _mm256_storeu_si256(reinterpret_cast<W*>(p), a); }
  static W Set1W(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
  // vdpbf16ps's step with two fmas (exact products; DenormalsFlushed does its DAZ and FTZ).
  static V DotPair(V acc, W a, W b) {
    const W hi = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(a, hi)),
                          _mm256_castsi256_ps(_mm256_and_si256(b, hi)), acc);
    return _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)),
                           _mm256_castsi256_ps(_mm256_slli_epi32(b, 16)), acc);
  }
  // FloatToBf16 per lane: round to nearest even, NaN quieted; the high halves packed in order.
  static W RoundBf16(V x) {
    const W u = _mm256_castps_si256(x);
    const W odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const W rounded = _mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
    const W nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                     _mm256_set1_epi32(0x7F800000));
    const W quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
    return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
  }
  static W PackPairs(const float* p) {
    const W a = RoundBf16(Load(p)), b = RoundBf16(Load(p + 8));
    // packus per 128-bit lane: a0-3 b0-3 | a4-7 b4-7; then the 64-bit quarters in order.
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
  }
  static void InterleaveTile(const uint16_t* r0, const uint16_t* r1, uint32_t* out) {
    const W a = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r0)));
    const W b = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r1)));
    StoreW(out, _mm256_or_si256(a, _mm256_slli_epi32(b, 16)));
  }
};

}  // namespace

const AttentionKernels& AttentionKernelsAvx2() { return AttentionImpl<Avx2Isa>::Table(); }

}  // namespace duet::compute::cpu::internal
