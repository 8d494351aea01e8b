// Internal to the AVX-512 translation units that work on bf16 words (attention_avx512*.cc,
// gemm_avx512*.cc): bf16_dot.h's rounding and dot step sixteen lanes at a time, in an
// anonymous namespace so that each unit compiles them for its own instruction set.
//
//   __m512i words = PackBf16Words(x);            // 16 words from x[0, 32)
//   acc = DotPairFmas(acc, words, weight_words);   // under DenormalsFlushed
#pragma once
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstdint>

namespace duet::compute::cpu::internal {
namespace {

// vdpbf16ps's step with two fmas (exact products; DenormalsFlushed does its DAZ and FTZ).
inline __m512 DotPairFmas(__m512 acc, __m512i a, __m512i b) {
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(a, hi)),
                        _mm512_castsi512_ps(_mm512_and_si512(b, hi)), acc);
  return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(a, 16)),
                         _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)), acc);
}

// FloatToBf16 per lane: round to nearest even, NaN quieted; the result in the low half.
inline __m512i RoundBf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  const __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x00400000));
  return _mm512_srli_epi32(_mm512_mask_blend_epi32(nan, rounded, quiet), 16);
}

// Bf16Word(p[2i], p[2i + 1]) for i < 16.
inline __m512i PackBf16Words(const float* p) {
  const __m512i a = RoundBf16(_mm512_loadu_ps(p)), b = RoundBf16(_mm512_loadu_ps(p + 16));
  // packus per 128-bit lane L: a(4L..4L+3) b(4L..4L+3); then the 64-bit quarters in order.
  return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
                                  _mm512_packus_epi32(a, b));
}

}  // namespace
}  // namespace duet::compute::cpu::internal
