// Tensor-core prefill attention: the flash-attention loop of the SIMT prefill kernel with both
// products (Q K^T and P V) on bf16 mma.sync through WMMA, fp32 accumulators. One block of 4 warps
// per (64-row query tile, q head); each warp owns 16 query rows. Per 64-key step: K and V tiles are
// staged in shared memory as bf16; S = Q K^T lands in shared memory as fp32; two lanes per row
// apply the causal / sliding-window mask and the online softmax and write P (bf16); the row's
// output accumulator (fp32, shared memory) is rescaled, then P V is accumulated onto it.
// Q is rounded to bf16 after scaling, P to bf16: expect bf16-level error (~1e-3 relative).
// int8/fp8 keys and values are dequantized (code * scale) in f32, then rounded to bf16 like the
// others.
#include <mma.h>

#include <cfloat>
#include <cstdint>

#include "common/compute/cuda/device_types.cuh"
#include "common/compute/cuda/kernels.h"

namespace duet::compute::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kRows = kTensorPrefillTileRows;  // 64
constexpr int kKeys = 64;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

template <int kD>
struct Smem {
  static constexpr int kLdq = kD + 8;   // bf16 elements (multiple of 8, 16-byte padding)
  static constexpr int kLds = kKeys + 4;  // fp32
  static constexpr int kLdp = kKeys + 8;  // bf16
  static constexpr int kLdo = kD + 4;   // fp32
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kRows * kLdq * 2;
  static constexpr int kV = kK + kKeys * kLdq * 2;
  static constexpr int kS = kV + kKeys * kLdq * 2;
  static constexpr int kP = kS + kRows * kLds * 4;
  static constexpr int kO = kP + kRows * kLdp * 2;
  static constexpr int kBytes = kO + kRows * kLdo * 4;
};

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    TensorPrefillKernel(const T* __restrict__ cache, LayerAddr addr, int group,
                        const float* __restrict__ q, AttentionMeta meta, float* __restrict__ out) {
  using S = Smem<kD>;
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem + S::kQ);
  __nv_bfloat16* ks = reinterpret_cast<__nv_bfloat16*>(smem + S::kK);
  __nv_bfloat16* vs = reinterpret_cast<__nv_bfloat16*>(smem + S::kV);
  float* ss = reinterpret_cast<float*>(smem + S::kS);
  __nv_bfloat16* ps = reinterpret_cast<__nv_bfloat16*>(smem + S::kP);
  float* os = reinterpret_cast<float*>(smem + S::kO);

  const int2 tile = meta.prefill_tiles[blockIdx.x];
  const DevSeq seq = meta.seqs[tile.x];
  const int h = blockIdx.y;
  const int kvh = h / group;
  const int32_t* table = meta.tables + seq.table_offset;
  const int64_t q_stride = static_cast<int64_t>(meta.num_q_heads) * kD;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int tile_rows = min(kRows, seq.q_len - tile.y);
  const int first_pos = seq.context_len - seq.q_len + tile.y;
  const int window = meta.sliding_window;

  // Q tile (scaled, bf16) and a zeroed output accumulator.
  for (int idx = t; idx < kRows * kD; idx += kThreads) {
    const int row = idx / kD, d = idx % kD;
    float v = 0.f;
    if (row < tile_rows) {
      v = q[(static_cast<int64_t>(seq.q_start) + tile.y + row) * q_stride +
            static_cast<int64_t>(h) * kD + d] * meta.scale;
    }
    qs[row * S::kLdq + d] = __float2bfloat16_rn(v);
    os[row * S::kLdo + d] = 0.f;
  }

  // Lane pair (2r', 2r'+1) of warp w owns row r = 16 w + r' for the softmax and the rescale.
  const int my_row = warp * 16 + lane / 2;
  const int half = lane % 2;
  const int my_pos = first_pos + my_row;
  const bool row_valid = my_row < tile_rows;
  float m = -FLT_MAX, l = 0.f;

  const int last_pos = first_pos + tile_rows - 1;
  const int key_lo = window > 0 ? max(0, first_pos - window + 1) : 0;
  const int key_hi = last_pos + 1;

  for (int k0 = key_lo; k0 < key_hi; k0 += kKeys) {
    __syncthreads();  // previous step's K/V consumed; Q and O initialised
    for (int idx = t; idx < kKeys * kD; idx += kThreads) {
      const int j = idx / kD, d = idx % kD;
      const int key = k0 + j;
      float kv = 0.f, vv = 0.f;
      if (key < key_hi) {
        const KvSpot spot = LocateKey(addr, table, key, kvh, kD);
        const int64_t off = spot.code + d;
        kv = DecodeKv(cache[off], LoadKvScale(cache, spot.scale));
        vv = DecodeKv(cache[off + addr.v_off], LoadKvScale(cache, spot.scale + addr.v_off));
      }
      ks[j * S::kLdq + d] = __float2bfloat16_rn(kv);
      vs[j * S::kLdq + d] = __float2bfloat16_rn(vv);
    }
    __syncthreads();

    // S[16 rows of this warp][64 keys] = Q K^T.
#pragma unroll
    for (int n = 0; n < kKeys / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
        wmma::load_matrix_sync(a, qs + warp * 16 * S::kLdq + kk * 16, S::kLdq);
        wmma::load_matrix_sync(b, ks + n * 16 * S::kLdq + kk * 16, S::kLdq);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(ss + warp * 16 * S::kLds + n * 16, acc, S::kLds, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax: this lane takes keys [32 half, 32 half + 32) of its row.
    float tile_max = -FLT_MAX;
    const float* srow = ss + my_row * S::kLds + half * 32;
    for (int j = 0; j < 32; ++j) {
      const int key = k0 + half * 32 + j;
      const bool ok = row_valid && key < key_hi && key <= my_pos && (window <= 0 || key > my_pos - window);
      if (ok) tile_max = fmaxf(tile_max, srow[j]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const bool any = m_new > -FLT_MAX;
    const float alpha = any ? expf(m - m_new) : 1.f;
    float psum = 0.f;
    __nv_bfloat16* prow = ps + my_row * S::kLdp + half * 32;
    for (int j = 0; j < 32; ++j) {
      const int key = k0 + half * 32 + j;
      const bool ok = row_valid && key < key_hi && key <= my_pos && (window <= 0 || key > my_pos - window);
      const float p = (ok && any) ? expf(srow[j] - m_new) : 0.f;
      const __nv_bfloat16 pb = __float2bfloat16_rn(p);
      prow[j] = pb;
      psum += __bfloat162float(pb);  // the sum of exactly what P V multiplies
    }
    psum += __shfl_xor_sync(0xffffffffu, psum, 1);
    l = l * alpha + psum;
    m = m_new;
    // Rescale this row's accumulator (the lane's half of the dims).
    float* orow = os + my_row * S::kLdo + half * (kD / 2);
    for (int d = 0; d < kD / 2; ++d) orow[d] *= alpha;
    __syncwarp();

    // O[16 rows][kD] += P V.
#pragma unroll
    for (int n = 0; n < kD / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      float* optr = os + warp * 16 * S::kLdo + n * 16;
      wmma::load_matrix_sync(acc, optr, S::kLdo, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
        wmma::load_matrix_sync(a, ps + warp * 16 * S::kLdp + kk * 16, S::kLdp);
        wmma::load_matrix_sync(b, vs + kk * 16 * S::kLdq + n * 16, S::kLdq);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(optr, acc, S::kLdo, wmma::mem_row_major);
    }
    __syncwarp();
  }
  __syncwarp();
  if (!row_valid) return;
  const float inv = l > 0.f ? 1.f / l : 0.f;
  float* dst = out + (static_cast<int64_t>(seq.q_start) + tile.y + my_row) * q_stride +
               static_cast<int64_t>(h) * kD + half * (kD / 2);
  const float* orow = os + my_row * S::kLdo + half * (kD / 2);
  for (int d = 0; d < kD / 2; ++d) dst[d] = orow[d] * inv;
}

template <typename T, int kD>
void Launch(const KvCacheArgs& c, const float* q, const AttentionMeta& meta, float* out,
            cudaStream_t s) {
  const LayerAddr a = MakeLayerAddr<T>(c);
  constexpr int smem = Smem<kD>::kBytes;
  cudaFuncSetAttribute(TensorPrefillKernel<T, kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       smem);
  const dim3 grid(meta.num_prefill_tiles, meta.num_q_heads);
  TensorPrefillKernel<T, kD><<<grid, kThreads, smem, s>>>(
      static_cast<const T*>(c.base), a, meta.num_q_heads / c.num_kv_heads, q, meta, out);
}

template <typename T>
bool ByHeadDim(const KvCacheArgs& c, const float* q, const AttentionMeta& meta, float* out,
               cudaStream_t s) {
  if (c.head_dim == 64) {
    Launch<T, 64>(c, q, meta, out, s);
  } else if (c.head_dim == 128) {
    Launch<T, 128>(c, q, meta, out, s);
  } else {
    return false;
  }
  return true;
}

}  // namespace

bool TensorPrefillSupports(int head_dim) { return head_dim == 64 || head_dim == 128; }

bool LaunchTensorPrefill(const KvCacheArgs& cache, const float* q, const AttentionMeta& meta,
                         float* out, cudaStream_t s) {
  if (meta.num_prefill_tiles == 0) return true;
  switch (cache.dtype) {
    case KvElemType::kF32:
      return ByHeadDim<float>(cache, q, meta, out, s);
    case KvElemType::kF16:
      return ByHeadDim<__half>(cache, q, meta, out, s);
    case KvElemType::kBF16:
      return ByHeadDim<__nv_bfloat16>(cache, q, meta, out, s);
    case KvElemType::kInt8:
      return ByHeadDim<KvInt8>(cache, q, meta, out, s);
    case KvElemType::kFp8E4M3:
      return ByHeadDim<KvFp8>(cache, q, meta, out, s);
  }
  return false;
}

}  // namespace duet::compute::cuda
