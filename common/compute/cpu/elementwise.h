// Row-wise and elementwise CPU kernels: RMSNorm, residual add, RoPE, SwiGLU, embedding lookup.
// Each row (or element) is computed by one thread in a fixed order, so results are
// independent of the batch and of the thread count. pool may be null (calling thread only).
//
//   RmsNormRows(&pool, x, weight, rows, dim, 1e-5f, y);
//   RopeRows(&pool, q, rows, num_heads, head_dim, positions, inv_freq.data(), inv_freq.size());
#pragma once

#include <cstdint>

#include "common/base/thread_pool.h"

namespace duet::compute::cpu {

// y = x * (1 / sqrt(mean(x^2) + eps)) * weight; the sum of squares is accumulated in double in
// index order. y may alias x.
void RmsNormRows(ThreadPool* pool, const float* x, const float* weight, int rows, int dim,
                 float eps, float* y);

// y[i] += x[i].
void AddInPlace(ThreadPool* pool, float* y, const float* x, int64_t n);

// In-place rotate_half RoPE on x [rows, num_heads * head_dim]: for i < head_dim/2 with
// angle = positions[r] * inv_freq[i] (in double; cos/sin cast to float),
// (a, b) = (x[i], x[i + half]) -> (a*cos - b*sin, b*cos + a*sin).
void RopeRows(ThreadPool* pool, float* x, int rows, int num_heads, int head_dim,
              const int32_t* positions, const float* inv_freq, int num_freq);

// RopeRows in two steps, so that the angles can be kept for the other calls of a pass with the
// same positions and frequencies (q and k, and every layer sharing a RoPE): the same bits.
// cos, sin [rows][half]: of positions[r] * inv_freq[i], in double, cast to float.
void RopeAngles(ThreadPool* pool, const int32_t* positions, int rows, const float* inv_freq,
                int half, float* cos, float* sin);
// x [rows, num_heads * head_dim] rotated by the angles of RopeAngles (half = head_dim / 2).
void RopeRotate(ThreadPool* pool, float* x, int rows, int num_heads, int head_dim, const float* cos,
                const float* sin);

// out = silu(gate) * up = gate / (1 + exp(-gate)) * up.
void SwiGluElems(ThreadPool* pool, const float* gate, const float* up, int64_t n, float* out);
void GeluTanhGluElems(ThreadPool* pool, const float* gate, const float* up, int64_t n, float* out);

// out[i, :] = table[ids[i], :].
void EmbedRows(ThreadPool* pool, const float* table, int dim, const int32_t* ids, int n,
               float* out);

}  // namespace duet::compute::cpu
