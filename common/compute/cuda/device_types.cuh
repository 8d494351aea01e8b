// Device-side helpers shared by duet's .cu files: float conversion of the KV/weight element
// types. Internal to common/compute/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace duet::compute::cuda {

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

inline unsigned BlocksFor(long long n, int threads) {
  long long b = (n + threads - 1) / threads;
  if (b > 1048576) b = 1048576;  // grid-stride loops cover the rest
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

}  // namespace duet::compute::cuda
