#include "common/compute/cpu/kv_codec.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/base/float16.h"
#include "common/base/float8.h"
#include "common/base/logging.h"

#if defined(__AVX2__)
#include <immintrin.h>
#define DUET_KV_AVX2 1
#else
#define DUET_KV_AVX2 0
#endif

namespace duet::compute::cpu {
namespace {

const std::array<float, 256>& Fp8Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = Fp8E4M3ToFloat(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

float AbsMax(const float* x, int n) {
  float m = 0.f;
  for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

}  // namespace

void EncodeKvToken(kv::KvDtype dtype, const float* x, int num_kv_heads, int head_dim, void* codes,
                   float* scales) {
  const int n = num_kv_heads * head_dim;
  switch (dtype) {
    case kv::KvDtype::kF32:
      std::memcpy(codes, x, static_cast<size_t>(n) * sizeof(float));
      return;
    case kv::KvDtype::kBF16: {
      auto* c = static_cast<uint16_t*>(codes);
      for (int i = 0; i < n; ++i) c[i] = FloatToBf16(x[i]);
      return;
    }
    case kv::KvDtype::kF16: {
      auto* c = static_cast<uint16_t*>(codes);
      for (int i = 0; i < n; ++i) c[i] = FloatToHalf(x[i]);
      return;
    }
    case kv::KvDtype::kInt8: {
      auto* c = static_cast<int8_t*>(codes);
      for (int h = 0; h < num_kv_heads; ++h) {
        const float* xh = x + static_cast<int64_t>(h) * head_dim;
        int8_t* ch = c + static_cast<int64_t>(h) * head_dim;
        const float scale = AbsMax(xh, head_dim) / 127.f;
        scales[h] = scale;
        for (int i = 0; i < head_dim; ++i) {
          const float q = scale > 0.f ? std::nearbyint(xh[i] / scale) : 0.f;
          ch[i] = static_cast<int8_t>(std::clamp(q, -127.f, 127.f));
        }
      }
      return;
    }
    case kv::KvDtype::kFp8E4M3: {
      auto* c = static_cast<uint8_t*>(codes);
      for (int h = 0; h < num_kv_heads; ++h) {
        const float* xh = x + static_cast<int64_t>(h) * head_dim;
        uint8_t* ch = c + static_cast<int64_t>(h) * head_dim;
        const float scale = AbsMax(xh, head_dim) / kFp8E4M3Max;
        scales[h] = scale;
        for (int i = 0; i < head_dim; ++i) {
          ch[i] = scale > 0.f ? FloatToFp8E4M3(xh[i] / scale) : 0;
        }
      }
      return;
    }
  }
  DUET_CHECK(false) << "EncodeKvToken: unknown KV dtype " << static_cast<int>(dtype);
}

void DecodeKvHeadPortable(kv::KvDtype dtype, const void* codes, float scale, int head_dim,
                          float* out) {
  switch (dtype) {
    case kv::KvDtype::kF32:
      std::memcpy(out, codes, static_cast<size_t>(head_dim) * sizeof(float));
      return;
    case kv::KvDtype::kBF16: {
      const auto* c = static_cast<const uint16_t*>(codes);
      for (int i = 0; i < head_dim; ++i) out[i] = Bf16ToFloat(c[i]);
      return;
    }
    case kv::KvDtype::kF16: {
      const auto* c = static_cast<const uint16_t*>(codes);
      for (int i = 0; i < head_dim; ++i) out[i] = HalfToFloat(c[i]);
      return;
    }
    case kv::KvDtype::kInt8: {
      const auto* c = static_cast<const int8_t*>(codes);
      for (int i = 0; i < head_dim; ++i) out[i] = static_cast<float>(c[i]) * scale;
      return;
    }
    case kv::KvDtype::kFp8E4M3: {
      const auto* c = static_cast<const uint8_t*>(codes);
      const std::array<float, 256>& t = Fp8Table();
      for (int i = 0; i < head_dim; ++i) out[i] = t[c[i]] * scale;
      return;
    }
  }
  DUET_CHECK(false) << "DecodeKvHead: unknown KV dtype " << static_cast<int>(dtype);
}

namespace {

#if DUET_KV_AVX2
// 8 codes at c -> 8 floats (times s for the scaled dtypes), the portable decoder's bits.
template <kv::KvDtype D>
inline __m256 Decode8(const uint8_t* c, __m256 s) {
  if constexpr (D == kv::KvDtype::kBF16) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  } else if constexpr (D == kv::KvDtype::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
  } else if constexpr (D == kv::KvDtype::kInt8) {
    const __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(w), s);
  } else {
    // E4M3 -> the f16 with the same sign, exponent field and mantissa shifted into place: that
    // f16 is the value times 2^-8 (normal and subnormal alike; the bias differs by 8), so
    // scaling by 2^8 is exact. The NaN codes (S.1111.111) become NaN, as in the table.
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c)));
    const __m128i mag = _mm_and_si128(b, _mm_set1_epi16(0x7f));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(mag, 7),
                                   _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8));
    __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.f));
    const __m256 nan =
        _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f))));
    v = _mm256_blendv_ps(v, _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()), nan);
    return _mm256_mul_ps(v, s);
  }
}

template <kv::KvDtype D>
void DecodeRowsSimd(const uint8_t* codes, int64_t code_stride, const float* scales,
                    int64_t scale_stride, int n, int head_dim, float* out) {
  constexpr size_t kBytes = D == kv::KvDtype::kBF16 || D == kv::KvDtype::kF16 ? 2 : 1;
  constexpr bool kScaled = D == kv::KvDtype::kInt8 || D == kv::KvDtype::kFp8E4M3;
  const int n8 = head_dim / 8 * 8;
  for (int r = 0; r < n; ++r) {
    const uint8_t* c = codes + r * code_stride;
    const float scale = kScaled ? scales[r * scale_stride] : 1.f;
    const __m256 s = _mm256_set1_ps(scale);
    float* o = out + static_cast<int64_t>(r) * head_dim;
    for (int i = 0; i < n8; i += 8) _mm256_storeu_ps(o + i, Decode8<D>(c + i * kBytes, s));
    if (n8 < head_dim) DecodeKvHeadPortable(D, c + n8 * kBytes, scale, head_dim - n8, o + n8);
  }
}
#endif

}  // namespace

void DecodeKvRows(kv::KvDtype dtype, const uint8_t* codes, int64_t code_stride, const float* scales,
                  int64_t scale_stride, int n, int head_dim, float* out) {
#if DUET_KV_AVX2 && defined(__F16C__)
  switch (dtype) {
    case kv::KvDtype::kBF16:
      return DecodeRowsSimd<kv::KvDtype::kBF16>(codes, code_stride, scales, scale_stride, n,
                                                head_dim, out);
    case kv::KvDtype::kF16:
      return DecodeRowsSimd<kv::KvDtype::kF16>(codes, code_stride, scales, scale_stride, n,
                                               head_dim, out);
    case kv::KvDtype::kInt8:
      return DecodeRowsSimd<kv::KvDtype::kInt8>(codes, code_stride, scales, scale_stride, n,
                                                head_dim, out);
    case kv::KvDtype::kFp8E4M3:
      return DecodeRowsSimd<kv::KvDtype::kFp8E4M3>(codes, code_stride, scales, scale_stride, n,
                                                   head_dim, out);
    default:
      break;
  }
#endif
  const bool scaled = kv::KvDtypeHasScales(dtype);
  for (int r = 0; r < n; ++r) {
    DecodeKvHeadPortable(dtype, codes + r * code_stride, scaled ? scales[r * scale_stride] : 1.f,
                         head_dim, out + static_cast<int64_t>(r) * head_dim);
  }
}

void DecodeKvHead(kv::KvDtype dtype, const void* codes, float scale, int head_dim, float* out) {
#if DUET_KV_AVX2
  const int n8 = head_dim / 8 * 8;
  if (n8 > 0 && dtype != kv::KvDtype::kF32) {
    const __m256 s = _mm256_set1_ps(scale);
    switch (dtype) {
      case kv::KvDtype::kBF16: {
        const auto* c = static_cast<const uint16_t*>(codes);
        for (int i = 0; i < n8; i += 8) {
          const __m256i w =
              _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i)));
          _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
        break;
      }
#if defined(__F16C__)
      case kv::KvDtype::kF16: {
        const auto* c = static_cast<const uint16_t*>(codes);
        for (int i = 0; i < n8; i += 8) {
          _mm256_storeu_ps(
              out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i))));
        }
        break;
      }
#endif
      case kv::KvDtype::kInt8: {
        const auto* c = static_cast<const int8_t*>(codes);
        for (int i = 0; i < n8; i += 8) {
          const __m256i w =
              _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + i)));
          _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(w), s));
        }
        break;
      }
      case kv::KvDtype::kFp8E4M3: {
        const auto* c = static_cast<const uint8_t*>(codes);
        const float* t = Fp8Table().data();
        for (int i = 0; i < n8; i += 8) {
          const __m256i idx =
              _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + i)));
          _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_i32gather_ps(t, idx, 4), s));
        }
        break;
      }
      default:
        DecodeKvHeadPortable(dtype, codes, scale, head_dim, out);
        return;
    }
    if (n8 < head_dim) {
      const size_t eb = kv::KvDtypeBytes(dtype);
      DecodeKvHeadPortable(dtype, static_cast<const uint8_t*>(codes) + n8 * eb, scale,
                           head_dim - n8, out + n8);
    }
    return;
  }
#endif
  DecodeKvHeadPortable(dtype, codes, scale, head_dim, out);
}

}  // namespace duet::compute::cpu
