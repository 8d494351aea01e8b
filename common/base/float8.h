// Bit-exact FP8 E4M3 (the OCP "E4M3FN" format: 4 exponent bits, bias 7, 3 mantissa bits, no
// infinities, NaN = S.1111.111, largest finite 448) conversions to and from float32. Encoding
// rounds to nearest even and saturates to +-448, as CUDA's __nv_cvt_float_to_fp8 with
// __NV_SATFINITE does, so host and device codes agree bit for bit.
//
//   uint8_t c = FloatToFp8E4M3(1.1f);   // 0x39 (1.125)
//   float f = Fp8E4M3ToFloat(c);         // 1.125f
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace duet {

inline constexpr float kFp8E4M3Max = 448.f;

inline float Fp8E4M3ToFloat(uint8_t c) {
  const float sign = (c & 0x80u) ? -1.f : 1.f;
  const int exp = (c >> 3) & 0xf;
  const int mant = c & 0x7;
  if (exp == 0xf && mant == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);  // subnormal: m * 2^-9
  return sign * std::ldexp(1.f + static_cast<float>(mant) / 8.f, exp - 7);
}

inline uint8_t FloatToFp8E4M3(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7fu;  // NaN
  const float a = std::bit_cast<float>(abs);
  if (a >= kFp8E4M3Max) return sign | 0x7eu;  // saturate (inf included)
  if (a < 0.015625f) {                        // below 2^-6: subnormal codes
    // a * 2^9 is exact; rounding it to an integer is round-to-nearest-even of the code. A result
    // of 8 is the smallest normal (exponent field 1, mantissa 0), which is code 8 too.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.f));
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
