// Element codecs of the quantized KV dtypes, compiled both by nvcc (the CUDA backend's KV write
// and attention kernels) and by the host compiler (tests), so that one source defines the bits
// on both sides. They follow common/compute/cpu/kv_codec.cc exactly: given the head's scale
// (max|x| / 127 for int8, max|x| / 448 for fp8, IEEE division; 0 for an all-zero head),
//   int8: code = round-to-nearest-even(x / scale) clamped to [-127, 127];
//   fp8 (OCP E4M3FN): code = FloatToFp8E4M3(x / scale) (round to nearest even, saturating);
// and a decoded element is float(code) * scale. The fp8 conversions are common/base/float8.h's
// own (host and device). No CUDA headers: plain arithmetic only.
//
//   const float scale = KvQuantScale(amax, kKvInt8Max);
//   int8_t c = KvQuantizeInt8(x, scale);        // == the CPU backend's code
//   float y = Fp8E4M3ToFloat(KvQuantizeFp8(x, scale)) * scale;   // common/base/float8.h
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/base/float8.h"

#if defined(__CUDACC__)
#define DUET_KV_QUANT_FN __host__ __device__ __forceinline__
#else
#define DUET_KV_QUANT_FN inline
#endif

namespace duet::compute::cuda {

inline constexpr float kKvInt8Max = 127.f;
inline constexpr float kKvFp8Max = kFp8E4M3Max;

// IEEE division (round to nearest), whatever the compiler's division flags.
DUET_KV_QUANT_FN float KvDivide(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// The scale of a head whose largest magnitude is `amax`: amax / max_code (0 for amax 0).
DUET_KV_QUANT_FN float KvQuantScale(float amax, float max_code) { return KvDivide(amax, max_code); }

DUET_KV_QUANT_FN int8_t KvQuantizeInt8(float x, float scale) {
  if (!(scale > 0.f)) return 0;
  float q = RoundToNearestEven(KvDivide(x, scale));
  q = q < -kKvInt8Max ? -kKvInt8Max : q;
  q = q > kKvInt8Max ? kKvInt8Max : q;
  return static_cast<int8_t>(q);
}

DUET_KV_QUANT_FN uint8_t KvQuantizeFp8(float x, float scale) {
  if (!(scale > 0.f)) return 0;
  return FloatToFp8E4M3(KvDivide(x, scale));
}

}  // namespace duet::compute::cuda
