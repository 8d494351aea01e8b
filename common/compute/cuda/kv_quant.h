// Element codecs of the quantized KV dtypes, compiled both by nvcc (the CUDA backend's KV write
// and attention kernels) and by the host compiler (tests), so that one source defines the bits
// on both sides. They follow common/compute/cpu/kv_codec.cc exactly: given the head's scale
// (max|x| / 127 for int8, max|x| / 448 for fp8, IEEE division; 0 for an all-zero head),
//   int8: code = round-to-nearest-even(x / scale) clamped to [-127, 127];
//   fp8 (OCP E4M3FN): code = FloatToFp8E4M3(x / scale) (round to nearest even, saturating);
// and a decoded element is float(code) * scale. No CUDA headers: plain arithmetic only.
//
//   const float scale = KvQuantScale(amax, kKvInt8Max);
//   int8_t c = KvQuantizeInt8(x, scale);        // == the CPU backend's code
//   float y = KvFp8ToFloat(KvQuantizeFp8(x, scale)) * scale;
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define DUET_KV_QUANT_FN __host__ __device__ __forceinline__
#else
#define DUET_KV_QUANT_FN inline
#endif

namespace duet::compute::cuda {

inline constexpr float kKvInt8Max = 127.f;
inline constexpr float kKvFp8Max = 448.f;

DUET_KV_QUANT_FN uint32_t KvFloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

DUET_KV_QUANT_FN float KvBitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// IEEE division (round to nearest), whatever the compiler's division flags.
DUET_KV_QUANT_FN float KvDivide(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// Round to nearest, ties to even (the default rounding mode on the host).
DUET_KV_QUANT_FN float KvRoundEven(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return nearbyintf(x);
#endif
}

// The scale of a head whose largest magnitude is `amax`: amax / max_code (0 for amax 0).
DUET_KV_QUANT_FN float KvQuantScale(float amax, float max_code) { return KvDivide(amax, max_code); }

DUET_KV_QUANT_FN int8_t KvQuantizeInt8(float x, float scale) {
  if (!(scale > 0.f)) return 0;
  float q = KvRoundEven(KvDivide(x, scale));
  q = q < -kKvInt8Max ? -kKvInt8Max : q;
  q = q > kKvInt8Max ? kKvInt8Max : q;
  return static_cast<int8_t>(q);
}

// float -> E4M3FN, round to nearest even, saturating to +-448 (common/base/float8.h).
DUET_KV_QUANT_FN uint8_t KvFloatToFp8(float f) {
  const uint32_t u = KvFloatBits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7fu;  // NaN
  const float a = KvBitsFloat(abs);
  if (a >= kKvFp8Max) return sign | 0x7eu;  // saturate (inf included)
  if (a < 0.015625f) {                      // below 2^-6: subnormal codes (a * 2^9 is exact)
    return sign | static_cast<uint8_t>(KvRoundEven(a * 512.f));
  }
  int exp = static_cast<int>(abs >> 23) - 127;  // -6 .. 8
  uint32_t keep = (abs >> 20) & 0x7u;
  const uint32_t rest = abs & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (keep & 1u))) {
    if (++keep == 8) {
      keep = 0;
      ++exp;
    }
  }
  const uint32_t code = static_cast<uint32_t>(exp + 7) << 3 | keep;
  return sign | static_cast<uint8_t>(code > 0x7eu ? 0x7eu : code);
}

// E4M3FN -> float (exact).
DUET_KV_QUANT_FN float KvFp8ToFloat(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t exp = (c >> 3) & 0xfu;
  const uint32_t mant = c & 0x7u;
  if (exp == 0xfu && mant == 0x7u) return KvBitsFloat(0x7fc00000u);  // NaN (as the CPU's)
  if (exp == 0) {  // subnormal: mant * 2^-9 (exact)
    const float m = static_cast<float>(mant) * 0.001953125f;
    return KvBitsFloat(sign | KvFloatBits(m));
  }
  return KvBitsFloat(sign | (exp + 120u) << 23 | mant << 20);
}

DUET_KV_QUANT_FN uint8_t KvQuantizeFp8(float x, float scale) {
  if (!(scale > 0.f)) return 0;
  return KvFloatToFp8(KvDivide(x, scale));
}

}  // namespace duet::compute::cuda
