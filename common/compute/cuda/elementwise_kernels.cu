// Elementwise and row-wise kernels: embedding, RMSNorm (+ fused residual add), RoPE, SwiGLU,
// bias, dtype conversion, uniform fill.
#include <cstdint>

#include "common/base/uniform_hash.h"
#include "common/compute/cuda/device_types.cuh"
#include "common/compute/cuda/kernels.h"

namespace duet::compute::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void EmbedKernel(const float* __restrict__ table, int dim, const int32_t* __restrict__ ids,
                            float* __restrict__ out) {
  const int row = blockIdx.x;
  const float* src = table + static_cast<int64_t>(ids[row]) * dim;
  float* dst = out + static_cast<int64_t>(row) * dim;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = src[j];
}

// Block-wide sum of a double (kThreads threads).
__device__ double BlockSum(double v) {
  __shared__ double warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  __syncthreads();  // warp_sums may be reused by the next call
  return total;
}

// One block per row. With residual != nullptr: x += residual first (written back to x).
__global__ void RmsNormKernel(float* __restrict__ x, const float* __restrict__ residual,
                              const float* __restrict__ weight, int dim, float eps,
                              float* __restrict__ y) {
  const int64_t off = static_cast<int64_t>(blockIdx.x) * dim;
  float* xr = x + off;
  double ss = 0.0;
  for (int j = threadIdx.x; j < dim; j += kThreads) {
    float v = xr[j];
    if (residual != nullptr) {
      v += residual[off + j];
      xr[j] = v;
    }
    ss += static_cast<double>(v) * v;
  }
  const double total = BlockSum(ss);
  const float inv = static_cast<float>(1.0 / sqrt(total / dim + static_cast<double>(eps)));
  for (int j = threadIdx.x; j < dim; j += kThreads) y[off + j] = xr[j] * inv * weight[j];
}

__global__ void AddKernel(float* __restrict__ y, const float* __restrict__ x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] += x[i];
  }
}

__global__ void AddBiasKernel(float* __restrict__ y, const float* __restrict__ bias, int rows,
                              int cols) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] += bias[i % cols];
  }
}

// One block per row; threads over (head, i < half). The angle is computed in double, as on the
// CPU, so large positions keep their precision.
__global__ void RopeKernel(float* __restrict__ x, int num_heads, int head_dim,
                           const int32_t* __restrict__ positions, const float* __restrict__ inv_freq,
                           int num_freq) {
  const int row = blockIdx.x;
  const int half = head_dim / 2;
  const double pos = positions[row];
  float* xr = x + static_cast<int64_t>(row) * num_heads * head_dim;
  for (int idx = threadIdx.x; idx < num_heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    if (i >= num_freq) continue;
    double sn, cs;
    sincos(pos * static_cast<double>(inv_freq[i]), &sn, &cs);
    const float c = static_cast<float>(cs), s = static_cast<float>(sn);
    float* p = xr + h * head_dim;
    const float a = p[i], b = p[i + half];
    p[i] = a * c - b * s;
    p[i + half] = b * c + a * s;
  }
}

// As the cpu backend's GeluTanhGluElems (PyTorch's tanh-approximated GELU).
__global__ void GeluTanhGluKernel(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = gate[i];
    const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanhf(inner)) * up[i];
  }
}

__global__ void SwiGluKernel(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

template <typename T>
__global__ void ConvertKernel(const float* __restrict__ src, T* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = FromFloat<T>(src[i]);
  }
}

template <typename T>
__global__ void FillUniformKernel(T* __restrict__ dst, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = FromFloat<T>(UniformFromHash(seed, static_cast<uint64_t>(i), scale));
  }
}

}  // namespace

void LaunchEmbed(const float* table, int dim, const int32_t* ids, int n, float* out,
                 cudaStream_t s) {
  if (n <= 0) return;
  EmbedKernel<<<n, kThreads, 0, s>>>(table, dim, ids, out);
}

void LaunchRmsNorm(const float* x, const float* weight, int rows, int dim, float eps, float* y,
                   cudaStream_t s) {
  if (rows <= 0) return;
  // x is only read when residual is null.
  RmsNormKernel<<<rows, kThreads, 0, s>>>(const_cast<float*>(x), nullptr, weight, dim, eps, y);
}

void LaunchAddRmsNorm(float* x, const float* residual, const float* weight, int rows, int dim,
                      float eps, float* y, cudaStream_t s) {
  if (rows <= 0) return;
  RmsNormKernel<<<rows, kThreads, 0, s>>>(x, residual, weight, dim, eps, y);
}

void LaunchAdd(float* y, const float* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  AddKernel<<<BlocksFor(n, kThreads), kThreads, 0, s>>>(y, x, n);
}

void LaunchAddBias(float* y, const float* bias, int rows, int cols, cudaStream_t s) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  if (n <= 0) return;
  AddBiasKernel<<<BlocksFor(n, kThreads), kThreads, 0, s>>>(y, bias, rows, cols);
}

void LaunchRope(float* x, int rows, int num_heads, int head_dim, const int32_t* positions,
                const float* inv_freq, int num_freq, cudaStream_t s) {
  if (rows <= 0) return;
  RopeKernel<<<rows, 128, 0, s>>>(x, num_heads, head_dim, positions, inv_freq, num_freq);
}

void LaunchSwiGlu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t s) {
  if (n <= 0) return;
  SwiGluKernel<<<BlocksFor(n, kThreads), kThreads, 0, s>>>(gate, up, n, out);
}

void LaunchGeluTanhGlu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t s) {
  if (n <= 0) return;
  GeluTanhGluKernel<<<BlocksFor(n, kThreads), kThreads, 0, s>>>(gate, up, n, out);
}

void LaunchConvertFromF32(const float* src, void* dst, ElemType dst_type, int64_t n,
                          cudaStream_t s) {
  if (n <= 0) return;
  const unsigned blocks = BlocksFor(n, kThreads);
  switch (dst_type) {
    case ElemType::kF32:
      ConvertKernel<float><<<blocks, kThreads, 0, s>>>(src, static_cast<float*>(dst), n);
      break;
    case ElemType::kF16:
      ConvertKernel<__half><<<blocks, kThreads, 0, s>>>(src, static_cast<__half*>(dst), n);
      break;
    case ElemType::kBF16:
      ConvertKernel<__nv_bfloat16>
          <<<blocks, kThreads, 0, s>>>(src, static_cast<__nv_bfloat16*>(dst), n);
      break;
  }
}

void LaunchFillUniform(void* dst, ElemType type, int64_t n, uint64_t seed, float scale,
                       cudaStream_t s) {
  if (n <= 0) return;
  const unsigned blocks = BlocksFor(n, kThreads);
  switch (type) {
    case ElemType::kF32:
      FillUniformKernel<float><<<blocks, kThreads, 0, s>>>(static_cast<float*>(dst), n, seed, scale);
      break;
    case ElemType::kF16:
      FillUniformKernel<__half><<<blocks, kThreads, 0, s>>>(static_cast<__half*>(dst), n, seed, scale);
      break;
    case ElemType::kBF16:
      FillUniformKernel<__nv_bfloat16>
          <<<blocks, kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(dst), n, seed, scale);
      break;
  }
}

}  // namespace duet::compute::cuda
