// Paged-KV kernels: KV write into the pool, and causal paged attention (GQA, sliding window)
// with two paths chosen per sequence by the host:
//  * prefill (q_len > kDecodePathMaxQLen): a tiled flash-attention kernel; one block per
//    (32-row query tile, q head), online softmax over 32-key tiles staged in shared memory;
//  * decode (q_len <= kDecodePathMaxQLen): one block per (query row, kv head, split of
//    kDecodeSplitKeys keys); its 4 warps share the GQA group's query heads, and a combine kernel
//    merges the splits. The split count depends only on the row's own context.
// Every output row depends only on its own query and its sequence's keys (batch-invariant).
// int8/fp8 caches are quantized per (token, kv head) by the write kernel exactly as the CPU
// backend does (kv_quant.h) and dequantized (code * scale) as the attention kernels load them.
#include <cfloat>
#include <cstdint>

#include "common/compute/cuda/device_types.cuh"
#include "common/compute/cuda/kernels.h"

namespace duet::compute::cuda {
namespace {

// f32/f16/bf16: one block per token, each element converted.
template <typename T>
__global__ void WriteKvKernel(T* __restrict__ base, LayerAddr a, const float* __restrict__ k,
                              const float* __restrict__ v, const int64_t* __restrict__ slots) {
  const int i = blockIdx.x;
  const int64_t slot = slots[i];
  const int64_t dst = a.layer_base + (slot / a.block_size) * a.block_stride +
                      (slot % a.block_size) * a.token_elems;
  const int64_t src = static_cast<int64_t>(i) * a.token_elems;
  for (int j = threadIdx.x; j < a.token_elems; j += blockDim.x) {
    base[dst + j] = FromFloat<T>(k[src + j]);
    base[dst + a.v_off + j] = FromFloat<T>(v[src + j]);
  }
}

// int8/fp8: grid (token, kv head), 2 warps: warp 0 quantizes the head's K, warp 1 its V, as
// cpu::EncodeKvToken does: scale = max|x| / max code (the max is exact in any order), then each
// code from x / scale; the scale goes after the half's codes.
template <typename T>
__global__ void __launch_bounds__(64)
    WriteKvQuantKernel(T* __restrict__ base, LayerAddr a, int head_dim, const float* __restrict__ k,
                       const float* __restrict__ v, const int64_t* __restrict__ slots) {
  const int i = blockIdx.x, kvh = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* x = (warp == 0 ? k : v) + static_cast<int64_t>(i) * a.token_elems +
                   static_cast<int64_t>(kvh) * head_dim;
  const int64_t slot = slots[i];
  const KvSpot spot =
      LocateKv(a, slot / a.block_size, static_cast<int>(slot % a.block_size), kvh, head_dim);
  const int64_t half = warp == 0 ? 0 : a.v_off;
  float amax = 0.f;
  for (int d = lane; d < head_dim; d += 32) amax = fmaxf(amax, fabsf(x[d]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float scale = KvQuantScale(amax, KvTraits<T>::kMaxCode);
  T* codes = base + spot.code + half;
  for (int d = lane; d < head_dim; d += 32) codes[d] = QuantizeKv<T>(x[d], scale);
  if (lane == 0) {
    *reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(base) + spot.scale + half) = scale;
  }
}

// ---------------------------------------------------------------- prefill (tiled flash)
constexpr int kTileK = 32;
constexpr int kPrefillThreads = 128;  // 32 rows x 4 threads per row

template <int kD>
constexpr int PrefillSmemBytes() {
  // Qs[32][kD+1], Ks[32][kD+1], Vs[32][kD], Ps[32][33]
  return static_cast<int>(sizeof(float)) *
         (kPrefillTileRows * (kD + 1) + kTileK * (kD + 1) + kTileK * kD + kPrefillTileRows * 33);
}

// Thread t owns query row r = t / 4 of the tile; within the row, lane c = t % 4 owns key
// columns c + 4j (j < 8) of each key tile and output dims c + 4i (i < kD / 4).
template <typename T, int kD>
__global__ void __launch_bounds__(kPrefillThreads)
    PrefillAttentionKernel(const T* __restrict__ cache, LayerAddr addr, int head_dim,
                           int group, const float* __restrict__ q, AttentionMeta meta,
                           float* __restrict__ out) {
  extern __shared__ float smem[];
  float* qs = smem;                                    // [32][kD+1]
  float* ks = qs + kPrefillTileRows * (kD + 1);        // [32][kD+1]
  float* vs = ks + kTileK * (kD + 1);                  // [32][kD]
  float* ps = vs + kTileK * kD;                        // [32][33]

  const int2 tile = meta.prefill_tiles[blockIdx.x];
  const DevSeq seq = meta.seqs[tile.x];
  const int h = blockIdx.y;
  const int kvh = h / group;
  const int32_t* table = meta.tables + seq.table_offset;
  const int64_t q_stride = static_cast<int64_t>(meta.num_q_heads) * head_dim;
  const int t = threadIdx.x;
  const int r = t >> 2, c = t & 3;
  const int tile_rows = min(kPrefillTileRows, seq.q_len - tile.y);
  const int first_pos = seq.context_len - seq.q_len + tile.y;
  const int my_pos = first_pos + r;
  const bool row_valid = r < tile_rows;
  const int window = meta.sliding_window;

  for (int idx = t; idx < kPrefillTileRows * kD; idx += kPrefillThreads) {
    const int row = idx / kD, d = idx % kD;
    float val = 0.f;
    if (row < tile_rows && d < head_dim) {
      val = q[(static_cast<int64_t>(seq.q_start) + tile.y + row) * q_stride +
              static_cast<int64_t>(h) * head_dim + d] * meta.scale;
    }
    qs[row * (kD + 1) + d] = val;
  }

  const int last_pos = first_pos + tile_rows - 1;
  const int key_lo = window > 0 ? max(0, first_pos - window + 1) : 0;
  const int key_hi = last_pos + 1;  // exclusive

  float acc[kD / 4];
#pragma unroll
  for (int i = 0; i < kD / 4; ++i) acc[i] = 0.f;
  float m = -FLT_MAX, l = 0.f;

  for (int k0 = key_lo; k0 < key_hi; k0 += kTileK) {
    __syncthreads();  // previous tile's ks/vs/ps fully consumed (and qs written, first time)
    for (int idx = t; idx < kTileK * kD; idx += kPrefillThreads) {
      const int j = idx / kD, d = idx % kD;
      const int key = k0 + j;
      float kv = 0.f, vv = 0.f;
      if (key < key_hi && d < head_dim) {
        const KvSpot spot = LocateKey(addr, table, key, kvh, head_dim);
        const int64_t off = spot.code + d;
        kv = DecodeKv(cache[off], LoadKvScale(cache, spot.scale));
        vv = DecodeKv(cache[off + addr.v_off], LoadKvScale(cache, spot.scale + addr.v_off));
      }
      ks[j * (kD + 1) + d] = kv;
      vs[j * kD + d] = vv;
    }
    __syncthreads();

    float sc[kTileK / 4];
#pragma unroll
    for (int jj = 0; jj < kTileK / 4; ++jj) sc[jj] = 0.f;
    const float* qrow = qs + r * (kD + 1);
#pragma unroll 4
    for (int d = 0; d < kD; ++d) {
      const float qv = qrow[d];
#pragma unroll
      for (int jj = 0; jj < kTileK / 4; ++jj) sc[jj] = fmaf(qv, ks[(c + 4 * jj) * (kD + 1) + d], sc[jj]);
    }
    float tile_max = -FLT_MAX;
#pragma unroll
    for (int jj = 0; jj < kTileK / 4; ++jj) {
      const int key = k0 + c + 4 * jj;
      const bool ok = row_valid && key < key_hi && key <= my_pos &&
                      (window <= 0 || key > my_pos - window);
      sc[jj] = ok ? sc[jj] : -FLT_MAX;
      tile_max = fmaxf(tile_max, sc[jj]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    const float m_new = fmaxf(m, tile_max);
    // A row with no allowed key yet keeps m = -FLT_MAX and p = 0 (no inf - inf).
    const bool any = m_new > -FLT_MAX;
    const float alpha = any ? expf(m - m_new) : 1.f;
    float psum = 0.f;
#pragma unroll
    for (int jj = 0; jj < kTileK / 4; ++jj) {
      const float p = (any && sc[jj] > -FLT_MAX) ? expf(sc[jj] - m_new) : 0.f;
      ps[r * 33 + c + 4 * jj] = p;
      psum += p;
    }
    psum += __shfl_xor_sync(0xffffffffu, psum, 1);
    psum += __shfl_xor_sync(0xffffffffu, psum, 2);
    l = l * alpha + psum;
    m = m_new;
    __syncwarp();  // the row's 4 threads share a warp: their ps writes are visible after this
#pragma unroll
    for (int i = 0; i < kD / 4; ++i) acc[i] *= alpha;
    const float* prow = ps + r * 33;
#pragma unroll 4
    for (int j = 0; j < kTileK; ++j) {
      const float p = prow[j];
      const float* vrow = vs + j * kD + c;
#pragma unroll
      for (int i = 0; i < kD / 4; ++i) acc[i] = fmaf(p, vrow[4 * i], acc[i]);
    }
  }

  if (!row_valid) return;
  const float inv = l > 0.f ? 1.f / l : 0.f;
  float* orow = out + (static_cast<int64_t>(seq.q_start) + tile.y + r) * q_stride +
                static_cast<int64_t>(h) * head_dim;
#pragma unroll
  for (int i = 0; i < kD / 4; ++i) {
    const int d = c + 4 * i;
    if (d < head_dim) orow[d] = acc[i] * inv;
  }
}

// ---------------------------------------------------------------- decode (split-K)
constexpr int kDecodeWarps = 4;
constexpr int kMaxGroupPerBlock = 8;  // query heads of one GQA group handled by one block

// grid: x = decode row, y = kv_head * group_chunks + chunk, z = split.
// Lane owns dims lane + 32 i (i < kD / 32); warp w takes keys start + w, start + w + 4, ...
template <typename T, int kD>
__global__ void __launch_bounds__(kDecodeWarps * 32)
    DecodeAttentionKernel(const T* __restrict__ cache, LayerAddr addr, int head_dim, int group,
                          int group_chunks, const float* __restrict__ q, AttentionMeta meta,
                          float* __restrict__ partials) {
  constexpr int kPerLane = kD / 32;
  __shared__ float red[kDecodeWarps][kMaxGroupPerBlock][kD + 2];

  const int4 row = meta.decode_rows[blockIdx.x];
  const int split = blockIdx.z;
  if (split >= row.z) return;  // this row needs fewer splits
  const DevSeq seq = meta.seqs[row.x];
  const int kvh = blockIdx.y / group_chunks;
  const int chunk = blockIdx.y % group_chunks;
  const int h0 = kvh * group + chunk * kMaxGroupPerBlock;
  const int ng = min(kMaxGroupPerBlock, group - chunk * kMaxGroupPerBlock);
  const int32_t* table = meta.tables + seq.table_offset;
  const int pos = seq.context_len - seq.q_len + row.y;
  const int lo = meta.sliding_window > 0 ? max(0, pos - meta.sliding_window + 1) : 0;
  const int k_begin = lo + split * kDecodeSplitKeys;
  const int k_end = min(pos + 1, k_begin + kDecodeSplitKeys);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q_row = (static_cast<int64_t>(seq.q_start) + row.y) * meta.num_q_heads * head_dim;

  float qv[kMaxGroupPerBlock][kPerLane];
  float acc[kMaxGroupPerBlock][kPerLane];
  float m[kMaxGroupPerBlock], l[kMaxGroupPerBlock];
#pragma unroll
  for (int g = 0; g < kMaxGroupPerBlock; ++g) {
    m[g] = -FLT_MAX;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + 32 * i;
      qv[g][i] = (g < ng && d < head_dim)
                     ? q[q_row + static_cast<int64_t>(h0 + g) * head_dim + d] * meta.scale
                     : 0.f;
      acc[g][i] = 0.f;
    }
  }

  for (int key = k_begin + warp; key < k_end; key += kDecodeWarps) {
    const KvSpot spot = LocateKey(addr, table, key, kvh, head_dim);
    const int64_t off = spot.code;
    const float kscale = LoadKvScale(cache, spot.scale);
    const float vscale = LoadKvScale(cache, spot.scale + addr.v_off);
    float kr[kPerLane], vr[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + 32 * i;
      kr[i] = d < head_dim ? DecodeKv(cache[off + d], kscale) : 0.f;
      vr[i] = d < head_dim ? DecodeKv(cache[off + addr.v_off + d], vscale) : 0.f;
    }
#pragma unroll
    for (int g = 0; g < kMaxGroupPerBlock; ++g) {
      if (g >= ng) break;
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) s = fmaf(qv[g][i], kr[i], s);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      const float m_new = fmaxf(m[g], s);
      const float alpha = expf(m[g] - m_new);  // 0 on the first key (m = -FLT_MAX)
      const float p = expf(s - m_new);
      l[g] = l[g] * alpha + p;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) acc[g][i] = fmaf(p, vr[i], acc[g][i] * alpha);
      m[g] = m_new;
    }
  }

  // Merge the warps: red[w][g] = {acc[0..kD), m, l}.
#pragma unroll
  for (int g = 0; g < kMaxGroupPerBlock; ++g) {
    if (g >= ng) break;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) red[warp][g][lane + 32 * i] = acc[g][i];
    if (lane == 0) {
      red[warp][g][kD] = m[g];
      red[warp][g][kD + 1] = l[g];
    }
  }
  __syncthreads();
  // partials[((row * Hq + h) * max_splits + split) * (head_dim + 2)]: {acc[head_dim], m, l}
  for (int idx = threadIdx.x; idx < ng * (head_dim + 2); idx += kDecodeWarps * 32) {
    const int g = idx / (head_dim + 2), e = idx % (head_dim + 2);
    float mx = -FLT_MAX;
    for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, red[w][g][kD]);
    float val = 0.f;
    if (e == head_dim) {
      val = mx;
    } else {
      for (int w = 0; w < kDecodeWarps; ++w) {
        const float wl = red[w][g][kD + 1];
        if (wl == 0.f) continue;  // warp saw no key
        const float f = expf(red[w][g][kD] - mx);
        val += (e == head_dim + 1 ? wl : red[w][g][e]) * f;
      }
    }
    const int64_t base =
        ((static_cast<int64_t>(blockIdx.x) * meta.num_q_heads + h0 + g) * meta.max_splits + split) *
        (head_dim + 2);
    partials[base + e] = val;
  }
}

// grid: x = decode row, y = q head; threads over head_dim.
__global__ void DecodeCombineKernel(const float* __restrict__ partials, AttentionMeta meta,
                                    int head_dim, float* __restrict__ out) {
  const int4 row = meta.decode_rows[blockIdx.x];
  const DevSeq seq = meta.seqs[row.x];
  const int h = blockIdx.y;
  const float* base = partials + (static_cast<int64_t>(blockIdx.x) * meta.num_q_heads + h) *
                                     meta.max_splits * (head_dim + 2);
  float mx = -FLT_MAX;
  for (int z = 0; z < row.z; ++z) mx = fmaxf(mx, base[z * (head_dim + 2) + head_dim]);
  float denom = 0.f;
  for (int z = 0; z < row.z; ++z) {
    const float* p = base + z * (head_dim + 2);
    if (p[head_dim + 1] > 0.f) denom += p[head_dim + 1] * expf(p[head_dim] - mx);
  }
  const float inv = denom > 0.f ? 1.f / denom : 0.f;
  float* orow = out + (static_cast<int64_t>(seq.q_start) + row.y) * meta.num_q_heads * head_dim +
                static_cast<int64_t>(h) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float v = 0.f;
    for (int z = 0; z < row.z; ++z) {
      const float* p = base + z * (head_dim + 2);
      if (p[head_dim + 1] > 0.f) v += p[d] * expf(p[head_dim] - mx);
    }
    orow[d] = v * inv;
  }
}

template <typename T, int kD>
void LaunchAttentionTyped(const KvCacheArgs& cache, const float* q, const AttentionMeta& meta,
                          float* out, float* partials, cudaStream_t s) {
  const LayerAddr addr = MakeLayerAddr<T>(cache);
  const T* base = static_cast<const T*>(cache.base);
  const int group = meta.num_q_heads / cache.num_kv_heads;
  if (meta.num_prefill_tiles > 0 && meta.tensor_core_prefill) {
    LaunchTensorPrefill(cache, q, meta, out, s);
  } else if (meta.num_prefill_tiles > 0) {
    constexpr int smem = PrefillSmemBytes<kD>();
    // Above 48 KiB a block needs the opt-in (cheap; done per launch so every device has it).
    cudaFuncSetAttribute(PrefillAttentionKernel<T, kD>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    const dim3 grid(meta.num_prefill_tiles, meta.num_q_heads);
    PrefillAttentionKernel<T, kD><<<grid, kPrefillThreads, smem, s>>>(
        base, addr, cache.head_dim, group, q, meta, out);
  }
  if (meta.num_decode_rows > 0) {
    const int chunks = (group + kMaxGroupPerBlock - 1) / kMaxGroupPerBlock;
    const dim3 grid(meta.num_decode_rows, cache.num_kv_heads * chunks, meta.max_splits);
    DecodeAttentionKernel<T, kD><<<grid, kDecodeWarps * 32, 0, s>>>(
        base, addr, cache.head_dim, group, chunks, q, meta, partials);
    const dim3 cgrid(meta.num_decode_rows, meta.num_q_heads);
    DecodeCombineKernel<<<cgrid, 128, 0, s>>>(partials, meta, cache.head_dim, out);
  }
}

template <typename T>
bool DispatchHeadDim(const KvCacheArgs& cache, const float* q, const AttentionMeta& meta,
                     float* out, float* partials, cudaStream_t s) {
  const int d = cache.head_dim;
  if (d <= 32) {
    LaunchAttentionTyped<T, 32>(cache, q, meta, out, partials, s);
  } else if (d <= 64) {
    LaunchAttentionTyped<T, 64>(cache, q, meta, out, partials, s);
  } else if (d <= 128) {
    LaunchAttentionTyped<T, 128>(cache, q, meta, out, partials, s);
  } else if (d <= 256) {
    LaunchAttentionTyped<T, 256>(cache, q, meta, out, partials, s);
  } else {
    return false;
  }
  return true;
}

}  // namespace

void LaunchWriteKv(const KvCacheArgs& cache, const float* k, const float* v, const int64_t* slots,
                   int n, cudaStream_t s) {
  if (n <= 0) return;
  const int64_t token_elems = static_cast<int64_t>(cache.num_kv_heads) * cache.head_dim;
  const int threads = token_elems >= 256 ? 256 : 128;
  const dim3 qgrid(n, cache.num_kv_heads);
  switch (cache.dtype) {
    case KvElemType::kF32:
      WriteKvKernel<float><<<n, threads, 0, s>>>(static_cast<float*>(cache.base),
                                                 MakeLayerAddr<float>(cache), k, v, slots);
      break;
    case KvElemType::kF16:
      WriteKvKernel<__half><<<n, threads, 0, s>>>(static_cast<__half*>(cache.base),
                                                  MakeLayerAddr<__half>(cache), k, v, slots);
      break;
    case KvElemType::kBF16:
      WriteKvKernel<__nv_bfloat16><<<n, threads, 0, s>>>(static_cast<__nv_bfloat16*>(cache.base),
                                                         MakeLayerAddr<__nv_bfloat16>(cache), k, v,
                                                         slots);
      break;
    case KvElemType::kInt8:
      WriteKvQuantKernel<KvInt8><<<qgrid, 64, 0, s>>>(static_cast<KvInt8*>(cache.base),
                                                      MakeLayerAddr<KvInt8>(cache), cache.head_dim,
                                                      k, v, slots);
      break;
    case KvElemType::kFp8E4M3:
      WriteKvQuantKernel<KvFp8><<<qgrid, 64, 0, s>>>(static_cast<KvFp8*>(cache.base),
                                                     MakeLayerAddr<KvFp8>(cache), cache.head_dim, k,
                                                     v, slots);
      break;
  }
}

int64_t DecodePartialFloats(const AttentionMeta& meta, int head_dim) {
  return static_cast<int64_t>(meta.num_decode_rows) * meta.num_q_heads * meta.max_splits *
         (head_dim + 2);
}

bool LaunchPagedAttention(const KvCacheArgs& cache, const float* q, const AttentionMeta& meta,
                          float* out, float* partials, cudaStream_t s) {
  switch (cache.dtype) {
    case KvElemType::kF32:
      return DispatchHeadDim<float>(cache, q, meta, out, partials, s);
    case KvElemType::kF16:
      return DispatchHeadDim<__half>(cache, q, meta, out, partials, s);
    case KvElemType::kBF16:
      return DispatchHeadDim<__nv_bfloat16>(cache, q, meta, out, partials, s);
    case KvElemType::kInt8:
      return DispatchHeadDim<KvInt8>(cache, q, meta, out, partials, s);
    case KvElemType::kFp8E4M3:
      return DispatchHeadDim<KvFp8>(cache, q, meta, out, partials, s);
  }
  return false;
}

}  // namespace duet::compute::cuda
