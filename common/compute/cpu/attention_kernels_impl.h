// Internal: the attention block kernels of attention_kernels.h, written once over a vector
// type and included by each per-ISA translation unit (attention_scalar.cc, attention_avx2.cc,
// attention_avx512.cc), which supplies `Isa`:
//   Isa::kW                     lanes per vector (8 or 16)
//   Isa::V, Isa::Load/Store/Set1/Zero/Fma/Mul/Sub/Max
//   Isa::Exp(V)                 SoftmaxExp per lane, the same operations
//   Isa::KeepRange(V, lane0, ja, jb, V other)   lanes lane0+i in [ja, jb] kept, others from other
//   Isa::FmaIf(bool, a, b, c)   c + a*b (fused) when true, c unchanged otherwise
//   Isa::ReduceMax(V)           exact
//   Isa::SumBlock(const float* p)   the fixed tree over 64 lanes, defined in ScalarSumBlock
//   Isa::TransposeTile(rows, e0, out)  out[i * kKeyBlock + j] = rows[j][e0 + i], i, j < kW
// and the tile shapes: Isa::kScoreRows x Isa::kScoreUnits (queries x 16-key units per score
// call), Isa::kAccRows x Isa::kAccVecs (queries x vectors of columns per accumulate call).
// Tile shapes change only which outputs share a load, never an output's operations.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/compute/cpu/attention_kernels.h"

namespace duet::compute::cpu::internal {
// Unnamed: every per-ISA translation unit instantiates its own, compiled for its instruction set.
namespace {

// The block sum's tree: lane-wise (g0 + g1) + (g2 + g3) over the four 16-key groups, then, over
// the 16 lanes, t[i] = a[i] + a[i + 8], u[i] = t[i] + t[i + 4], w[i] = u[i] + u[i + 2], and
// w[0] + w[1].
inline float ScalarSumBlock(const float* p) {
  float a[16];
  for (int i = 0; i < 16; ++i) a[i] = (p[i] + p[16 + i]) + (p[32 + i] + p[48 + i]);
  float t[8], u[4], w[2];
  for (int i = 0; i < 8; ++i) t[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; ++i) u[i] = t[i] + t[i + 4];
  for (int i = 0; i < 2; ++i) w[i] = u[i] + u[i + 2];
  return w[0] + w[1];
}

// Calls f.template operator()<R>() with R == n, for 1 <= n <= kMax (tile shapes chosen at run
// time among those compiled).
template <int kMax, typename F>
void WithCount(int n, F&& f) {
  if constexpr (kMax >= 1) {
    if (n == kMax) {
      f.template operator()<kMax>();
    } else {
      WithCount<kMax - 1>(n, f);
    }
  }
}

template <typename Isa>
struct AttentionImpl {
  using V = typename Isa::V;
  static constexpr int kW = Isa::kW;
  static constexpr int kUnitVecs = kKeyUnit / kW;

  // R queries x U units of keys.
  template <int R, int U>
  static void ScoreTile(const float* const* q, const float* kt, int d, float scale, float* s) {
    constexpr int kVecs = U * kUnitVecs;
    V acc[R][kVecs];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < kVecs; ++v) acc[r][v] = Isa::Zero();
    }
    for (int e = 0; e < d; ++e) {
      V k[kVecs];
#pragma GCC unroll 8
      for (int v = 0; v < kVecs; ++v) k[v] = Isa::Load(kt + e * kKeyBlock + v * kW);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const V b = Isa::Set1(q[r][e]);
#pragma GCC unroll 8
        for (int v = 0; v < kVecs; ++v) acc[r][v] = Isa::Fma(b, k[v], acc[r][v]);
      }
    }
    const V sc = Isa::Set1(scale);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < kVecs; ++v)
        Isa::Store(s + r * kKeyBlock + v * kW, Isa::Mul(acc[r][v], sc));
    }
  }

  template <int R>
  static void ScoreRows(const float* const* q, const float* kt, int d, int u0, int u1, float scale,
                        float* s) {
    constexpr int kU = Isa::kScoreUnits;
    for (int u = u0; u < u1;) {
      const int n = std::min(kU, u1 - u);
      WithCount<kU>(
          n, [&]<int U>() { ScoreTile<R, U>(q, kt + u * kKeyUnit, d, scale, s + u * kKeyUnit); });
      u += n;
    }
  }

  static void Scores(const float* const* q, int nq, const float* kt, int d, int u0, int u1,
                     float scale, float* s) {
    constexpr int kR = Isa::kScoreRows;
    static_assert(kR >= 1 && kR <= 8);
    for (int qi = 0; qi < nq; qi += kR) {
      WithCount<kR>(std::min(kR, nq - qi), [&]<int R>() {
        ScoreRows<R>(q + qi, kt, d, u0, u1, scale, s + qi * kKeyBlock);
      });
    }
  }

  static float Softmax(float* s, int ja, int jb, float* m, float* l) {
    constexpr int kVecs = kKeyBlock / kW;
    const V neg_inf = Isa::Set1(-std::numeric_limits<float>::infinity());
    V mx = neg_inf;
#pragma GCC unroll 8
    for (int v = 0; v < kVecs; ++v) {
      mx = Isa::Max(mx, Isa::KeepRange(Isa::Load(s + v * kW), v * kW, ja, jb, neg_inf));
    }
    const float m_new = std::max(*m, Isa::ReduceMax(mx));
    const V mv = Isa::Set1(m_new);
    const V zero = Isa::Zero();
#pragma GCC unroll 8
    for (int v = 0; v < kVecs; ++v) {
      const V p = Isa::Exp(Isa::Sub(Isa::Load(s + v * kW), mv));
      Isa::Store(s + v * kW, Isa::KeepRange(p, v * kW, ja, jb, zero));
    }
    const float alpha = SoftmaxExp(*m - m_new);
    *l = *l * alpha + Isa::SumBlock(s);
    *m = m_new;
    return alpha;
  }

  // R queries x NV vectors of columns starting at column e0.
  template <int R, int NV>
  static void AccTile(const float* p, const int* ja, const int* jb, const float* alpha,
                      const float* const* rows, int j0, int j1, int d, int e0, float* acc) {
    V a[R][NV];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const V al = Isa::Set1(alpha[r]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) a[r][v] = Isa::Mul(Isa::Load(acc + r * d + e0 + v * kW), al);
    }
    for (int j = j0; j <= j1; ++j) {
      V x[NV];
      const float* row = rows[j] + e0;
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) x[v] = Isa::Load(row + v * kW);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const bool on = ja[r] <= j && j <= jb[r];
        const V pb = Isa::Set1(p[r * kKeyBlock + j]);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) a[r][v] = Isa::FmaIf(on, pb, x[v], a[r][v]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) Isa::Store(acc + r * d + e0 + v * kW, a[r][v]);
    }
  }

  template <int R>
  static void AccRows(const float* p, const int* ja, const int* jb, const float* alpha,
                      const float* const* rows, int j0, int j1, int d, float* acc) {
    constexpr int kNV = Isa::kAccVecs;
    int e = 0;
    for (; e + kNV * kW <= d; e += kNV * kW)
      AccTile<R, kNV>(p, ja, jb, alpha, rows, j0, j1, d, e, acc);
    for (; e + kW <= d; e += kW) AccTile<R, 1>(p, ja, jb, alpha, rows, j0, j1, d, e, acc);
    // Columns past the last whole vector: the same operations, one element at a time.
    for (; e < d; ++e) {
      for (int r = 0; r < R; ++r) {
        float x = acc[r * d + e] * alpha[r];
        for (int j = j0; j <= j1; ++j) {
          if (ja[r] <= j && j <= jb[r]) x = std::fma(p[r * kKeyBlock + j], rows[j][e], x);
        }
        acc[r * d + e] = x;
      }
    }
  }

  static void Accumulate(const float* p, const int* ja, const int* jb, const float* alpha, int nq,
                         const float* const* rows, int j0, int j1, int d, float* acc) {
    constexpr int kR = Isa::kAccRows;
    static_assert(kR >= 1 && kR <= 8);
    for (int qi = 0; qi < nq; qi += kR) {
      WithCount<kR>(std::min(kR, nq - qi), [&]<int R>() {
        AccRows<R>(p + qi * kKeyBlock, ja + qi, jb + qi, alpha + qi, rows, j0, j1, d,
                   acc + static_cast<int64_t>(qi) * d);
      });
    }
  }

  // Whole kW x kW tiles (keys all in [j0, j1], kW dims) through Isa::TransposeTile; the rest one
  // element at a time. Data movement only: any split gives the same kt.
  static void Transpose(const float* const* rows, int j0, int j1, int d, float* kt) {
    const int c0 = (j0 / kKeyUnit) * kKeyUnit;
    const int c1 = (j1 / kKeyUnit + 1) * kKeyUnit;
    for (int jb = c0; jb < c1; jb += kW) {
      const bool full = jb >= j0 && jb + kW - 1 <= j1;
      int e = 0;
      if (full) {
        for (; e + kW <= d; e += kW) Isa::TransposeTile(rows + jb, e, kt + e * kKeyBlock + jb);
      }
      for (; e < d; ++e) {
        float* out = kt + e * kKeyBlock;
        for (int j = jb; j < jb + kW; ++j) out[j] = j0 <= j && j <= j1 ? rows[j][e] : 0.f;
      }
    }
  }

  static void ExpN(const float* x, int n, float* out) {
    for (int i = 0; i + kW <= n; i += kW) Isa::Store(out + i, Isa::Exp(Isa::Load(x + i)));
  }

  static const AttentionKernels& Table() {
    static const AttentionKernels k{&Scores, &Softmax, &Accumulate, &Transpose, &ExpN};
    return k;
  }
};

}  // namespace
}  // namespace duet::compute::cpu::internal
