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
//   Isa::TransposeTile(rows, e0, out)  out[i * kKeyBlock + j] = rows[j][e0 + i], i, j < kW, for
//                               rows of float or of 32-bit words
// and for bf16 K/V (attention_kernels.h), on words of two bf16:
//   Isa::W, Isa::LoadW/StoreW/Set1W   kW words
//   Isa::DotPair(V acc, W a, W b)     vdpbf16ps's step per lane (hi pair, then lo pair)
//   Isa::PackPairs(const float* p)    kW words from 2 kW floats: FloatToBf16 of p[2i] | of p[2i +
//   1]
//                                     << 16
//   Isa::InterleaveTile(r0, r1, out)  out[i] = r0[i] | r1[i] << 16, i < kW
// and the tile shapes: Isa::kScoreRows x Isa::kScoreUnits (queries x 16-key units per score
// call), Isa::kAccRows x Isa::kAccVecs (queries x vectors of columns per accumulate call).
// Tile shapes change only which outputs share a load, never an output's operations.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
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

  // The score chain's operands: floats (each step an fma) or words of two bf16 (each step
  // DotPair, attention_kernels.h).
  static V LoadOp(const float* p) { return Isa::Load(p); }
  static V SplatOp(float x) { return Isa::Set1(x); }
  static V Step(V acc, V k, V q) { return Isa::Fma(q, k, acc); }
  static typename Isa::W LoadOp(const uint32_t* p) { return Isa::LoadW(p); }
  static typename Isa::W SplatOp(uint32_t x) { return Isa::Set1W(x); }
  static V Step(V acc, typename Isa::W k, typename Isa::W q) { return Isa::DotPair(acc, k, q); }

  // R queries x U units of keys; n elements (floats or words) per query and key.
  template <int R, int U, typename T>
  static void ScoreTile(const T* const* q, const T* kt, int n, float scale, float* s) {
    constexpr int kVecs = U * kUnitVecs;
    using Op = decltype(LoadOp(kt));
    V acc[R][kVecs];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < kVecs; ++v) acc[r][v] = Isa::Zero();
    }
    for (int e = 0; e < n; ++e) {
      Op k[kVecs];
#pragma GCC unroll 8
      for (int v = 0; v < kVecs; ++v) k[v] = LoadOp(kt + e * kKeyBlock + v * kW);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const Op b = SplatOp(q[r][e]);
#pragma GCC unroll 8
        for (int v = 0; v < kVecs; ++v) acc[r][v] = Step(acc[r][v], k[v], b);
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

  template <typename T>
  static void Scores(const T* const* q, int nq, const T* kt, int n, int u0, int u1, float scale,
                     float* s) {
    constexpr int kR = Isa::kScoreRows;
    constexpr int kU = Isa::kScoreUnits;
    static_assert(kR >= 1 && kR <= 8);
    for (int qi = 0; qi < nq; qi += kR) {
      WithCount<kR>(std::min(kR, nq - qi), [&]<int R>() {
        for (int u = u0; u < u1;) {
          const int c = std::min(kU, u1 - u);
          WithCount<kU>(c, [&]<int U>() {
            ScoreTile<R, U>(q + qi, kt + u * kKeyUnit, n, scale, s + qi * kKeyBlock + u * kKeyUnit);
          });
          u += c;
        }
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
  template <typename T>
  static void Transpose(const T* const* rows, int j0, int j1, int d, T* kt) {
    const int c0 = (j0 / kKeyUnit) * kKeyUnit;
    const int c1 = (j1 / kKeyUnit + 1) * kKeyUnit;
    for (int jb = c0; jb < c1; jb += kW) {
      const bool full = jb >= j0 && jb + kW - 1 <= j1;
      int e = 0;
      if (full) {
        for (; e + kW <= d; e += kW) Isa::TransposeTile(rows + jb, e, kt + e * kKeyBlock + jb);
      }
      for (; e < d; ++e) {
        T* out = kt + e * kKeyBlock;
        for (int j = jb; j < jb + kW; ++j) out[j] = j0 <= j && j <= j1 ? rows[j][e] : T{0};
      }
    }
  }

  static void ExpN(const float* x, int n, float* out) {
    for (int i = 0; i + kW <= n; i += kW) Isa::Store(out + i, Isa::Exp(Isa::Load(x + i)));
  }

  // ---- bf16 K/V on words of two bf16 (attention_kernels.h).
  using W = typename Isa::W;

  static void TransposeWords(const uint32_t* const* rows, int j0, int j1, int dp, uint32_t* kt) {
    Transpose<uint32_t>(rows, j0, j1, dp, kt);
  }

  static void Interleave(const uint16_t* const* rows, int jp0, int jp1, int d, uint32_t* vt) {
    for (int jp = jp0; jp <= jp1; ++jp) {
      const uint16_t* r0 = rows[2 * jp];
      const uint16_t* r1 = rows[2 * jp + 1];
      uint32_t* out = vt + static_cast<int64_t>(jp) * d;
      int e = 0;
      for (; e + kW <= d; e += kW) Isa::InterleaveTile(r0 + e, r1 + e, out + e);
      for (; e < d; ++e) out[e] = r0[e] | static_cast<uint32_t>(r1[e]) << 16;
    }
  }

  // R queries x NV vectors of columns starting at column e0; pw[r * kPairs + jp] the words of p.
  static constexpr int kPairs = kKeyBlock / 2;
  template <int R, int NV>
  static void AccTileBf16(const uint32_t* pw, const float* alpha, const uint32_t* vt, int jp0,
                          int jp1, int d, int e0, float* acc) {
    V a[R][NV];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const V al = Isa::Set1(alpha[r]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) a[r][v] = Isa::Mul(Isa::Load(acc + r * d + e0 + v * kW), al);
    }
    for (int jp = jp0; jp <= jp1; ++jp) {
      W x[NV];
      const uint32_t* row = vt + static_cast<int64_t>(jp) * d + e0;
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) x[v] = Isa::LoadW(row + v * kW);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const W pb = Isa::Set1W(pw[r * kPairs + jp]);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) a[r][v] = Isa::DotPair(a[r][v], x[v], pb);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) Isa::Store(acc + r * d + e0 + v * kW, a[r][v]);
    }
  }

  template <int R>
  static void AccRowsBf16(const uint32_t* pw, const float* alpha, const uint32_t* vt, int jp0,
                          int jp1, int d, float* acc) {
    constexpr int kNV = Isa::kAccVecs;
    int e = 0;
    for (; e + kNV * kW <= d; e += kNV * kW)
      AccTileBf16<R, kNV>(pw, alpha, vt, jp0, jp1, d, e, acc);
    for (; e + kW <= d; e += kW) AccTileBf16<R, 1>(pw, alpha, vt, jp0, jp1, d, e, acc);
    // Columns past the last whole vector: the same operations, one element at a time.
    for (; e < d; ++e) {
      for (int r = 0; r < R; ++r) {
        float x = acc[r * d + e] * alpha[r];
        for (int jp = jp0; jp <= jp1; ++jp)
          x = ScalarDotPair(x, vt[jp * d + e], pw[r * kPairs + jp]);
        acc[r * d + e] = x;
      }
    }
  }

  static void AccumulateBf16(const float* p, const float* alpha, int nq, const uint32_t* vt,
                             int jp0, int jp1, int d, float* acc) {
    constexpr int kR = Isa::kAccRows;
    static_assert(kR >= 1 && kR <= 8 && kPairs % kW == 0);
    alignas(64) uint32_t pw[kR * kPairs];
    for (int qi = 0; qi < nq; qi += kR) {
      const int rows = std::min(kR, nq - qi);
      for (int r = 0; r < rows; ++r) {
        for (int w = 0; w < kPairs; w += kW) {
          Isa::StoreW(pw + r * kPairs + w, Isa::PackPairs(p + (qi + r) * kKeyBlock + 2 * w));
        }
      }
      WithCount<kR>(rows, [&]<int R>() {
        AccRowsBf16<R>(pw, alpha + qi, vt, jp0, jp1, d, acc + static_cast<int64_t>(qi) * d);
      });
    }
  }

  static const AttentionKernels& Table() {
    static const AttentionKernels k{&Scores<float>,    &Softmax,    &Accumulate,
                                    &Transpose<float>, &ExpN,       &Scores<uint32_t>,
                                    &TransposeWords,   &Interleave, &AccumulateBf16};
    return k;
  }
};

}  // namespace
}  // namespace duet::compute::cpu::internal
