#include "common/compute/cpu/elementwise.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "common/base/logging.h"

namespace duet::compute::cpu {
namespace {

constexpr int64_t kElemGrain = 1 << 15;  // elementwise work per chunk
// An activation's eight-lane exp costs about an eighth of libm's per element; one decode row is
// split among the threads all the same.
constexpr int64_t kTranscendentalGrain = 512;

// Eight floats in the build target's vectors (GCC's vector extension: one ymm under AVX2, two
// xmm on plain x86-64). Every operation is per lane, so a lane's result never depends on its
// neighbours or on where the array starts: SwiGlu and GeluTanhGlu stay batch-invariant.
using F8 = float __attribute__((vector_size(32)));
using I8 = int32_t __attribute__((vector_size(32)));

// e^x per lane, within a few ulp on [-87.3, 88.7] (SwiGlu's and GeluTanhGlu's tests sweep the
// range against double): x = n ln2 + r with |r| <= ln2 / 2, e^r by Cephes' degree-6
// polynomial, 2^n built in the exponent bits. Below the range the result is e^-87.3, above it
// e^88.7; NaN stays NaN.
inline F8 Exp8(F8 x) {
  const F8 hi = F8{} + 88.7f, lo = F8{} - 87.3f;
  x = x > hi ? hi : x;  // comparisons false for NaN: it passes through
  x = x < lo ? lo : x;
  // Round x / ln2 to the nearest integer by adding and subtracting 1.5 x 2^23.
  const F8 magic = F8{} + 12582912.f;
  const F8 n = (x * 1.44269504088896341f + magic) - magic;
  // ln2 in two parts (Cephes): n * 0.693359375 is exact for |n| <= 128.
  const F8 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  F8 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.f;
  const I8 bits = (__builtin_convertvector(n, I8) + 127) << 23;
  return p * std::bit_cast<F8>(bits);
}

// out[i] = f(a[i], b[i]) for f over eight lanes; the last partial group goes through the same
// eight-lane code on a zero-padded copy, so every element gets the same bits wherever it lies.
template <typename F>
void Map8(const float* a, const float* b, int64_t begin, int64_t end, float* out, F f) {
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    F8 va, vb;
    std::memcpy(&va, a + i, sizeof(va));
    std::memcpy(&vb, b + i, sizeof(vb));
    const F8 y = f(va, vb);
    std::memcpy(out + i, &y, sizeof(y));
  }
  if (i < end) {
    const size_t rest = static_cast<size_t>(end - i) * sizeof(float);
    F8 va{}, vb{};
    std::memcpy(&va, a + i, rest);
    std::memcpy(&vb, b + i, rest);
    const F8 y = f(va, vb);
    std::memcpy(out + i, &y, rest);
  }
}

void ParallelOrInline(ThreadPool* pool, int64_t n, int64_t grain,
                      const std::function<void(int64_t, int64_t)>& fn) {
  if (pool == nullptr) {
    if (n > 0) fn(0, n);
  } else {
    pool->ParallelFor(n, grain, fn);
  }
}

// Rows per chunk so that a chunk holds roughly kElemGrain elements.
int64_t RowGrain(int64_t row_elems) {
  return row_elems <= 0 ? 1 : std::max<int64_t>(1, kElemGrain / row_elems);
}

}  // namespace

void RmsNormRows(ThreadPool* pool, const float* x, const float* weight, int rows, int dim,
                 float eps, float* y) {
  ParallelOrInline(pool, rows, RowGrain(dim), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * dim;
      float* yr = y + r * dim;
      double sum_sq = 0.0;
      for (int i = 0; i < dim; ++i) sum_sq += static_cast<double>(xr[i]) * xr[i];
      const float inv_rms =
          static_cast<float>(1.0 / std::sqrt(sum_sq / dim + static_cast<double>(eps)));
      for (int i = 0; i < dim; ++i) yr[i] = (xr[i] * inv_rms) * weight[i];
    }
  });
}

void AddInPlace(ThreadPool* pool, float* y, const float* x, int64_t n) {
  ParallelOrInline(pool, n, kElemGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] += x[i];
  });
}

void RopeAngles(ThreadPool* pool, const int32_t* positions, int rows, const float* inv_freq,
                int half, float* cos, float* sin) {
  ParallelOrInline(pool, rows, RowGrain(half), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const double pos = positions[r];
      for (int i = 0; i < half; ++i) {
        const double angle = pos * static_cast<double>(inv_freq[i]);
        cos[r * half + i] = static_cast<float>(std::cos(angle));
        sin[r * half + i] = static_cast<float>(std::sin(angle));
      }
    }
  });
}

void RopeRotate(ThreadPool* pool, float* x, int rows, int num_heads, int head_dim, const float* cos,
                const float* sin) {
  DUET_CHECK(head_dim % 2 == 0) << "RoPE needs an even head_dim, got " << head_dim;
  const int half = head_dim / 2;
  const int64_t row_elems = static_cast<int64_t>(num_heads) * head_dim;
  ParallelOrInline(pool, rows, RowGrain(row_elems), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* c = cos + r * half;
      const float* s = sin + r * half;
      for (int h = 0; h < num_heads; ++h) {
        float* xh = x + r * row_elems + static_cast<int64_t>(h) * head_dim;
        for (int i = 0; i < half; ++i) {
          const float a = xh[i];
          const float b = xh[i + half];
          xh[i] = a * c[i] - b * s[i];
          xh[i + half] = b * c[i] + a * s[i];
        }
      }
    }
  });
}

void RopeRows(ThreadPool* pool, float* x, int rows, int num_heads, int head_dim,
              const int32_t* positions, const float* inv_freq, int num_freq) {
  DUET_CHECK(head_dim % 2 == 0) << "RoPE needs an even head_dim, got " << head_dim;
  const int half = head_dim / 2;
  DUET_CHECK(num_freq == half) << "RoPE inv_freq has " << num_freq << " entries, need " << half;
  std::vector<float> cos(static_cast<size_t>(rows) * half), sin(cos.size());
  RopeAngles(pool, positions, rows, inv_freq, half, cos.data(), sin.data());
  RopeRotate(pool, x, rows, num_heads, head_dim, cos.data(), sin.data());
}

void SwiGluElems(ThreadPool* pool, const float* gate, const float* up, int64_t n, float* out) {
  ParallelOrInline(pool, n, kTranscendentalGrain, [&](int64_t begin, int64_t end) {
    Map8(gate, up, begin, end, out, [](F8 g, F8 u) { return g / (1.f + Exp8(-g)) * u; });
  });
}

void GeluTanhGluElems(ThreadPool* pool, const float* gate, const float* up, int64_t n, float* out) {
  // PyTorch's gelu(approximate="tanh"): 0.5 x (1 + tanh u), u = sqrt(2 / pi) (x + 0.044715 x^3),
  // as the same function x / (1 + e^(-2u)) (1 + tanh u = 2 / (1 + e^(-2u))) with Exp8. In float,
  // 1 + tanh u cancels to nothing once u < -9, where this form keeps its relative precision.
  constexpr float kBeta = 0.7978845608028654f;
  constexpr float kKappa = 0.044715f;
  ParallelOrInline(pool, n, kTranscendentalGrain, [&](int64_t begin, int64_t end) {
    Map8(gate, up, begin, end, out, [](F8 x, F8 u) {
      const F8 inner = kBeta * (x + kKappa * x * x * x);
      return x / (1.f + Exp8(-2.f * inner)) * u;
    });
  });
}

void EmbedRows(ThreadPool* pool, const float* table, int dim, const int32_t* ids, int n,
               float* out) {
  ParallelOrInline(pool, n, RowGrain(dim), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      DUET_CHECK(ids[i] >= 0) << "negative token id " << ids[i];
      std::memcpy(out + i * dim, table + static_cast<int64_t>(ids[i]) * dim,
                  static_cast<size_t>(dim) * sizeof(float));
    }
  });
}

}  // namespace duet::compute::cpu
