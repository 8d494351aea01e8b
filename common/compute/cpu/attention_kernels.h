// Internal to attention.cc and its per-ISA translation units: the block kernels of the tiled
// paged attention (attention.h). A work item's queries run over the keys in blocks of
// kKeyBlock positions aligned to multiples of kKeyBlock; each kernel below defines, per query
// and per element, one fixed sequence of float operations, which every path (scalar, AVX2,
// AVX-512) performs identically lane by lane, so the paths give the same bits:
//   score  s[j] = scale * (fma chain over e = 0, 1, ..., d-1 of q[e] * k_j[e], from 0)
//   max    m' = max(m, max of the block's valid scores)            (exact in any order)
//   p[j]   = SoftmaxExp(s[j] - m') for valid keys, 0 otherwise
//   sum    l' = l * alpha + BlockSum(p), alpha = SoftmaxExp(m - m'),
//          BlockSum = a fixed tree over the block's 64 lanes (kernels' SumBlock)
//   acc    acc' = acc * alpha, then fma(p[j], v_j[e], acc') for the valid j in order
// over the blocks of one key split (512 positions, attention.cc), whose states then merge in
// split order (attention.cc's PartialStates), and at the end out = acc / l.
//
// bf16 K/V (kv dtype bf16, even head dims) run the same steps on 32-bit words that each hold two
// bf16 (element 2i in the low half, 2i + 1 in the high half), with vdpbf16ps's dot step
//   DotPair(acc, a, b) = fma(lo(a), lo(b), fma(hi(a), hi(b), acc))   (hi pair first)
// in place of the fma chains: q is rounded to bf16 (FloatToBf16), scores are the DotPair chain over
// the d / 2 words of q and k, p is rounded to bf16 for the V sum (l sums the unrounded p), and the
// V sum runs DotPair over pairs of keys (2jp, 2jp + 1) with p = 0 outside a query's range. The
// caller runs the whole work item with denormals flushed (DenormalsFlushed), which is what
// vdpbf16ps does to its own operands and results, so the paths that emulate it with two fmas
// give its bits.
//
//   const AttentionKernels& k = AttentionKernelsFor(CpuIsa::kAvx512);
//   k.scores(q, nq, kt, d, u0, u1, scale, s);
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/base/float16.h"
#include "common/compute/cpu/bf16_dot.h"
#include "common/compute/cpu/cpu_isa.h"

namespace duet::compute::cpu::internal {

// Keys per block; blocks start at multiples of it, whatever the work item's tiling.
inline constexpr int kKeyBlock = 64;
// Keys per score unit: the score kernels cover units [u0, u1) of a block.
inline constexpr int kKeyUnit = 16;
inline constexpr int kUnitsPerBlock = kKeyBlock / kKeyUnit;

// exp(x) for the softmax, x <= 0: 2^n * poly(r) with n = nearest-even(x * log2 e) and
// r = x - n ln 2 in two fma steps, a degree-5 polynomial by Horner (fma), and 0 for x < -86
// (exp(-86) is 4e-38: below anything a softmax sum of >= 1 can show). Relative error < 2e-7.
// The vector kernels compute exactly these operations per lane.
inline constexpr float kExpLog2e = 1.44269504088896341f;
inline constexpr float kExpLn2Hi = 0.693359375f;
inline constexpr float kExpLn2Lo = -2.12194440e-4f;
inline constexpr float kExpMin = -86.f;
inline constexpr float kExpP0 = 1.9875691500e-4f;
inline constexpr float kExpP1 = 1.3981999507e-3f;
inline constexpr float kExpP2 = 8.3334519073e-3f;
inline constexpr float kExpP3 = 4.1665795894e-2f;
inline constexpr float kExpP4 = 1.6666665459e-1f;
inline constexpr float kExpP5 = 5.0000001201e-1f;

// In an unnamed namespace: each per-ISA translation unit compiles its own copy for its own
// instruction set (one merged inline copy could carry AVX-512 code into the AVX2 path).
namespace {
inline float SoftmaxExp(float x) {
  if (!(x >= kExpMin)) return x != x ? x : 0.f;  // NaN stays NaN
  const float n = std::nearbyint(x * kExpLog2e);
  float r = std::fma(n, -kExpLn2Hi, x);
  r = std::fma(n, -kExpLn2Lo, r);
  float p = kExpP0;
  p = std::fma(p, r, kExpP1);
  p = std::fma(p, r, kExpP2);
  p = std::fma(p, r, kExpP3);
  p = std::fma(p, r, kExpP4);
  p = std::fma(p, r, kExpP5);
  const float z = r * r;
  float y = std::fma(p, z, r);
  y = y + 1.f;
  uint32_t bits;
  std::memcpy(&bits, &y, 4);
  bits += static_cast<uint32_t>(static_cast<int32_t>(n)) << 23;
  std::memcpy(&y, &bits, 4);
  return y;
}
}  // namespace

struct AttentionKernels {
  // s[qi * kKeyBlock + j] = scale * dot(q[qi], key j), the key's elements at kt[e * kKeyBlock
  // + j] (the block transposed), for qi < nq and j in units [u0, u1).
  void (*scores)(const float* const* q, int nq, const float* kt, int d, int u0, int u1, float scale,
                 float* s);
  // One query's softmax step over a block: s [kKeyBlock] holds its scores, valid in [ja, jb]
  // (ja <= jb); replaces them with p (0 outside [ja, jb]), updates *m and *l and returns alpha.
  float (*softmax)(float* s, int ja, int jb, float* m, float* l);
  // For qi < nq and e < d: acc[qi * d + e] = acc * alpha[qi], then for j = j0..j1 with
  // ja[qi] <= j <= jb[qi]: acc = fma(p[qi * kKeyBlock + j], rows[j][e], acc).
  void (*accumulate)(const float* p, const int* ja, const int* jb, const float* alpha, int nq,
                     const float* const* rows, int j0, int j1, int d, float* acc);
  // kt[e * kKeyBlock + j] = rows[j][e] for j in [j0, j1], 0 for the other j of units
  // [j0 / kKeyUnit, j1 / kKeyUnit], e < d.
  void (*transpose)(const float* const* rows, int j0, int j1, int d, float* kt);
  // Exposed for tests: out[i] = SoftmaxExp(x[i]) computed by this path's vector code, n a
  // multiple of kKeyUnit.
  void (*exp)(const float* x, int n, float* out);

  // ---- bf16 K/V, on words (above).
  // s[qi * kKeyBlock + j] = scale * (DotPair chain over the dp words of q[qi] and key j, from 0),
  // key j's words at kt[w * kKeyBlock + j], for units [u0, u1).
  void (*scores_bf16)(const uint32_t* const* q, int nq, const uint32_t* kt, int dp, int u0, int u1,
                      float scale, float* s);
  // transpose on words: kt[w * kKeyBlock + j] = rows[j][w] for j in [j0, j1], 0 for the other j
  // of units [j0 / kKeyUnit, j1 / kKeyUnit], w < dp.
  void (*transpose_words)(const uint32_t* const* rows, int j0, int j1, int dp, uint32_t* kt);
  // vt[jp * d + e] = rows[2jp][e] | rows[2jp + 1][e] << 16 for jp in [jp0, jp1], e < d.
  void (*interleave)(const uint16_t* const* rows, int jp0, int jp1, int d, uint32_t* vt);
  // For qi < nq and e < d: acc[qi * d + e] = acc * alpha[qi] (a denormal product flushed), then
  // for jp = jp0..jp1: acc = DotPair(acc, vt[jp * d + e], pair jp of bf16(p[qi * kKeyBlock + j])).
  void (*accumulate_bf16)(const float* p, const float* alpha, int nq, const uint32_t* vt, int jp0,
                          int jp1, int d, float* acc);
};

const AttentionKernels& AttentionKernelsScalar();
const AttentionKernels& AttentionKernelsAvx2();
const AttentionKernels& AttentionKernelsAvx512();
const AttentionKernels& AttentionKernelsAvx512Bf16();

// The kernels of path `isa` (which the caller has checked the CPU runs).
const AttentionKernels& AttentionKernelsFor(CpuIsa isa);

}  // namespace duet::compute::cpu::internal
