// Bit-exact FP8 E4M3 (the OCP "E4M3FN" format: 4 exponent bits, bias 7, 3 mantissa bits, no
// infinities, NaN = S.1111.111, largest finite 448) conversions to and from float32. Encoding
// rounds to nearest even and saturates to +-448, as CUDA's __nv_cvt_float_to_fp8 with
// __NV_SATFINITE does. Plain arithmetic only, compiled by the host compiler and by nvcc (the
// CUDA KV kernels use these very functions), so host and device codes agree bit for bit.
//
//   uint8_t c = FloatToFp8E4M3(1.1f);   // 0x39 (1.125)
//   float f = Fp8E4M3ToFloat(c);         // 1.125f
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define DUET_FLOAT8_FN __host__ __device__ __forceinline__
#else
#define DUET_FLOAT8_FN inline
#endif

namespace duet {

inline constexpr float kFp8E4M3Max = 448.f;

namespace float8_internal {

DUET_FLOAT8_FN uint32_t Bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

DUET_FLOAT8_FN float FromBits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

}  // namespace float8_internal

// Round to nearest, ties to even, on host (the default rounding mode) and device alike.
DUET_FLOAT8_FN float RoundToNearestEven(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return nearbyintf(x);
#endif
}

// E4M3FN -> float (exact); the NaN codes give a positive quiet NaN.
DUET_FLOAT8_FN float Fp8E4M3ToFloat(uint8_t c) {
  using float8_internal::Bits;
  using float8_internal::FromBits;
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t exp = (c >> 3) & 0xfu;
  const uint32_t mant = c & 0x7u;
  if (exp == 0xfu && mant == 0x7u) return FromBits(0x7fc00000u);
  if (exp == 0) return FromBits(sign | Bits(static_cast<float>(mant) * 0.001953125f));  // m*2^-9
  return FromBits(sign | (exp + 120u) << 23 | mant << 20);
}

DUET_FLOAT8_FN uint8_t FloatToFp8E4M3(float f) {
  using float8_internal::FromBits;
  const uint32_t u = float8_internal::Bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7fu;  // NaN
  const float a = FromBits(abs);
  if (a >= kFp8E4M3Max) return sign | 0x7eu;  // saturate (inf included)
  if (a < 0.015625f) {                        // below 2^-6: subnormal codes
    // a * 2^9 is exact; rounding it to an integer is round-to-nearest-even of the code. A result
    // of 8 is the smallest normal (exponent field 1, mantissa 0), which is code 8 too.
    return sign | static_cast<uint8_t>(RoundToNearestEven(a * 512.f));
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

}  // namespace duet
