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
  // 8 keys x 8 dims: unpack pairs of rows, shuffle 64-bit pairs, swap 128-bit halves.
  static void TransposeTile(const float* const* rows, int e0, float* out) {
    __m256 r[8], t[8], u[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows[i] + e0);
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
};

}  // namespace

const AttentionKernels& AttentionKernelsAvx2() { return AttentionImpl<Avx2Isa>::Table(); }

}  // namespace duet::compute::cpu::internal
