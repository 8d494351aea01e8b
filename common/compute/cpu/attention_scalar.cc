// The attention block kernels' portable path: the reference every vector path must equal bit
// for bit (attention_kernels.h). 16 "lanes" as plain arrays, each operation done per lane.
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/compute/cpu/attention_kernels_impl.h"

namespace duet::compute::cpu::internal {
namespace {

struct ScalarIsa {
  static constexpr int kW = 16;
  static constexpr int kScoreRows = 4;
  static constexpr int kScoreUnits = 1;
  static constexpr int kAccRows = 4;
  static constexpr int kAccVecs = 1;
  struct V {
    float l[kW];
  };
  static V Load(const float* p) {
    V r;
    for (int i = 0; i < kW; ++i) r.l[i] = p[i];
    return r;
  }
  static void Store(float* p, const V& a) {
    for (int i = 0; i < kW; ++i) p[i] = a.l[i];
  }
  static V Set1(float x) {
    V r;
    for (int i = 0; i < kW; ++i) r.l[i] = x;
    return r;
  }
  static V Zero() { return Set1(0.f); }
  static V Fma(const V& a, const V& b, const V& c) {
    V r;
    for (int i = 0; i < kW; ++i) r.l[i] = std::fma(a.l[i], b.l[i], c.l[i]);
    return r;
  }
  static V Mul(const V& a, const V& b) {
    V r;
    for (int i = 0; i < kW; ++i) r.l[i] = a.l[i] * b.l[i];
    return r;
  }
  static V Sub(const V& a, const V& b) {
    V r;
    for (int i = 0; i < kW; ++i) r.l[i] = a.l[i] - b.l[i];
    return r;
  }
  static V Max(const V& a, const V& b) {
    V r;
    for (int i = 0; i < kW; ++i) r.l[i] = std::max(a.l[i], b.l[i]);
    return r;
  }
  static V Exp(const V& x) {
    V r;
    for (int i = 0; i < kW; ++i) r.l[i] = SoftmaxExp(x.l[i]);
    return r;
  }
  static V KeepRange(const V& x, int lane0, int ja, int jb, const V& other) {
    V r;
    for (int i = 0; i < kW; ++i) r.l[i] = ja <= lane0 + i && lane0 + i <= jb ? x.l[i] : other.l[i];
    return r;
  }
  static V FmaIf(bool on, const V& a, const V& b, const V& c) { return on ? Fma(a, b, c) : c; }
  static float ReduceMax(const V& a) {
    float m = a.l[0];
    for (int i = 1; i < kW; ++i) m = std::max(m, a.l[i]);
    return m;
  }
  static float SumBlock(const float* p) { return ScalarSumBlock(p); }
  template <typename T>
  static void TransposeTile(const T* const* rows, int e0, T* out) {
    for (int i = 0; i < kW; ++i) {
      for (int j = 0; j < kW; ++j) out[i * kKeyBlock + j] = rows[j][e0 + i];
    }
  }

  struct W {
    uint32_t l[kW];
  };
  static W LoadW(const uint32_t* p) {
    W r;
    std::memcpy(r.l, p, sizeof(r.l));
    return r;
  }
  static void StoreW(uint32_t* p, const W& a) { std::memcpy(p, a.l, sizeof(a.l)); }
  static W Set1W(uint32_t x) {
    W r;
    for (int i = 0; i < kW; ++i) r.l[i] = x;
    return r;
  }
  static V DotPair(const V& acc, const W& a, const W& b) {
    V r;
    for (int i = 0; i < kW; ++i) r.l[i] = ScalarDotPair(acc.l[i], a.l[i], b.l[i]);
    return r;
  }
  static W PackPairs(const float* p) {
    W r;
    for (int i = 0; i < kW; ++i) r.l[i] = Bf16Word(p[2 * i], p[2 * i + 1]);
    return r;
  }
  static void InterleaveTile(const uint16_t* r0, const uint16_t* r1, uint32_t* out) {
    for (int i = 0; i < kW; ++i) out[i] = r0[i] | static_cast<uint32_t>(r1[i]) << 16;
  }
};

}  // namespace

const AttentionKernels& AttentionKernelsScalar() { return AttentionImpl<ScalarIsa>::Table(); }

const AttentionKernels& AttentionKernelsFor(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return AttentionKernelsScalar();
    case CpuIsa::kAvx2:
      return AttentionKernelsAvx2();
    case CpuIsa::kAvx512:
    case CpuIsa::kAvx512Vnni:
      return AttentionKernelsAvx512();
    case CpuIsa::kAvx512Bf16:
    case CpuIsa::kAmx:
      return AttentionKernelsAvx512Bf16();
  }
  return AttentionKernelsScalar();
}

}  // namespace duet::compute::cpu::internal
