// Device-side helpers shared by duet's .cu files: float conversion of the KV/weight element
// types, and where a (token, kv head)'s K/V codes and scales live in the paged KV region.
// Internal to common/compute/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/compute/cuda/kernels.h"
#include "common/compute/cuda/kv_quant.h"

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

// Codes of the quantized KV dtypes (one byte; element = code * the (token, kv head) scale).
struct KvInt8 {
  int8_t v;
};
struct KvFp8 {
  uint8_t v;
};
static_assert(sizeof(KvInt8) == 1 && sizeof(KvFp8) == 1);

template <typename T>
struct KvTraits {
  static constexpr bool kQuantized = false;
};
template <>
struct KvTraits<KvInt8> {
  static constexpr bool kQuantized = true;
  static constexpr float kMaxCode = kKvInt8Max;
};
template <>
struct KvTraits<KvFp8> {
  static constexpr bool kQuantized = true;
  static constexpr float kMaxCode = kKvFp8Max;
};

__device__ __forceinline__ float ToFloat(KvInt8 c) { return static_cast<float>(c.v); }
__device__ __forceinline__ float ToFloat(KvFp8 c) { return Fp8E4M3ToFloat(c.v); }

template <typename T>
__device__ __forceinline__ T QuantizeKv(float x, float scale);
template <>
__device__ __forceinline__ KvInt8 QuantizeKv<KvInt8>(float x, float scale) {
  return KvInt8{KvQuantizeInt8(x, scale)};
}
template <>
__device__ __forceinline__ KvFp8 QuantizeKv<KvFp8>(float x, float scale) {
  return KvFp8{KvQuantizeFp8(x, scale)};
}

// Offsets into one layer of the paged KV region, in elements of T (bytes for the 1-byte codes):
//   block = [K half][V half], half = [token][kv head][head dim] codes, then (quantized dtypes
//   only) [token][kv head] f32 scales (kv::KvLayout).
struct LayerAddr {
  int64_t layer_base;    // this layer's first element
  int64_t block_stride;  // one block: 2 * half
  int64_t token_elems;   // kv_heads * head_dim
  int64_t v_off;         // one half (codes and scales): V is this far after K
  int64_t scale_off;     // the half's scales, from the half's start (quantized dtypes)
  int block_size;
  int num_kv_heads;
};

template <typename T>
__host__ LayerAddr MakeLayerAddr(const KvCacheArgs& c) {
  LayerAddr a;
  a.token_elems = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  a.scale_off = static_cast<int64_t>(c.block_size) * a.token_elems;
  // Quantized codes are bytes, so the scales' bytes count as elements.
  const int64_t scale_elems =
      KvTraits<T>::kQuantized ? static_cast<int64_t>(c.num_kv_heads) * 4 : 0;
  a.v_off = static_cast<int64_t>(c.block_size) * (a.token_elems + scale_elems);
  a.block_stride = 2 * a.v_off;
  a.layer_base = static_cast<int64_t>(c.layer) * c.num_blocks * a.block_stride;
  a.block_size = c.block_size;
  a.num_kv_heads = c.num_kv_heads;
  return a;
}

// Where the K of (block, token offset, kv head) is: its first code, in elements of T from the
// region's start, and (quantized dtypes only) the byte offset of its scale. V's are a.v_off
// further (quantized codes are bytes, so one offset serves both).
struct KvSpot {
  int64_t code;
  int64_t scale;
};

__device__ __forceinline__ KvSpot LocateKv(const LayerAddr& a, int64_t block, int offset, int kvh,
                                           int head_dim) {
  const int64_t half = a.layer_base + block * a.block_stride;
  KvSpot s;
  s.code =
      half + static_cast<int64_t>(offset) * a.token_elems + static_cast<int64_t>(kvh) * head_dim;
  s.scale = half + a.scale_off + (static_cast<int64_t>(offset) * a.num_kv_heads + kvh) * 4;
  return s;
}

__device__ __forceinline__ KvSpot LocateKey(const LayerAddr& a, const int32_t* table, int key,
                                            int kvh, int head_dim) {
  return LocateKv(a, table[key / a.block_size], key % a.block_size, kvh, head_dim);
}

// The scale at `scale` (1 for unquantized dtypes, which have none).
template <typename T>
__device__ __forceinline__ float LoadKvScale(const T* cache, int64_t scale) {
  if constexpr (KvTraits<T>::kQuantized) {
    return *reinterpret_cast<const float*>(reinterpret_cast<const unsigned char*>(cache) + scale);
  } else {
    return 1.f;
  }
}

// One decoded element: float(code) * scale for quantized dtypes, the value itself otherwise.
template <typename T>
__device__ __forceinline__ float DecodeKv(T code, float scale) {
  if constexpr (KvTraits<T>::kQuantized) {
    return ToFloat(code) * scale;
  } else {
    return ToFloat(code);
  }
}

inline unsigned BlocksFor(long long n, int threads) {
  long long b = (n + threads - 1) / threads;
  if (b > 1048576) b = 1048576;  // grid-stride loops cover the rest
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

}  // namespace duet::compute::cuda
