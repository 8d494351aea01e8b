#include "common/compute/cpu/kv_codec.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

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
