// Integer-dot-product GEMM on weights kept in their GGUF block format (Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, and the K-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K): y[m, n] = x[m, k] * dequant(w)[n, k]^T
// (+ bias[n]).
//
// Each activation row is quantized on its own to int8 blocks of 32 (Q8_0-style: d = amax / 127,
// q = round-to-nearest-even(x / d), clamped to +-127; and the block's sum of q), so a row's codes
// depend on nothing but that row. Per output element and weight block b the kernel forms the
// block's exact int32 dot product isum_b of the codes and accumulates, for b = 0, 1, ... in
// order, starting from 0 (a K-quant's 32-element sub-blocks are blocks here):
//   Q8_0:       acc = fma(dw_b * dx_b, isum_b, acc)       (isum_b = sum qw * qx)
//   Q4_0, Q5_0: acc = fma(dw_b * dx_b, isum_b, acc)       (isum_b = sum code * qx - o sum qx,
//                                                           o = 8 for Q4_0, 16 for Q5_0)
//   Q4_1, Q5_1: acc = fma(dw_b * dx_b, isum_b, acc); acc = fma(mw_b, dx_b * sum qx, acc)
//   Q4_K, Q5_K: as Q4_1 with dw_b = d * sc_b and mw_b = -(dmin * m_b), both exact in float
//   Q6_K, Q3_K: acc = fma(dw_b0 * dx_b, isum_b0, acc); acc = fma(dw_b1 * dx_b, isum_b1, acc)
//               over the block's two halves of 16 (dw_bh = d * sc_bh, exact; isum_bh =
//               sum code * qx - o sum qx over the half, o = 32 for Q6_K, 4 for Q3_K, so a
//               Q3_K matrix gives the bits of the same values written as Q6_K)
//   Q2_K:       acc = fma(d * dx_b, sc_b0 isum_b0 + sc_b1 isum_b1, acc);
//               acc = fma(-(dmin * dx_b), m_b0 sum_b0 qx + m_b1 sum_b1 qx, acc)
//               (isum_bh = sum code * qx over half h; the integer combinations are exact)
// then y = acc + bias. Integer sums are exact and every float step is the same in every code
// path (scalar, AVX2, AVX-512, AVX-512 VNNI), so a row's result is bitwise independent of the
// other rows of the call, of the thread count and of the CPU path.
//
// Weights are repacked once (same bytes per element as the GGUF blocks) into groups of 16 output
// rows: for group g and block b, the 16 half scales d (Q4_1 / Q5_1: then the 16 half mins m;
// Q5_x: then 16 words of fifth bits), then the codes with four consecutive k of one row per
// 32-bit lane (Q8_0: 8 steps of 4 k; Q4_x / Q5_x: 4 steps of 8 k, k..k+3 in the low nibbles and
// k+4..k+7 in the high ones), so one broadcast 32-bit activation word feeds 16 outputs and no
// horizontal sum is needed. A Q5_x row's fifth-bit word has, in byte t, bit 2s for element
// 8s + t and bit 2s + 1 for element 8s + 4 + t (quant_kernels.h has the offsets). The K-quants
// keep their integer scales per group-block (Q4_K / Q5_K: 16 sc then 16 m, uint8; Q6_K / Q3_K:
// 16 int8 scales per half; Q2_K: 16 bytes sc | m << 4 per half) before their codes (Q2_K /
// Q3_K: one 64-byte vector per half of 16, bits 2f, 2f + 1 of byte t of a row's word holding
// element 4f + t of the half; Q5_K: then the fifth bits as Q5_x's; Q6_K: then two 64-byte
// vectors of high bit pairs, steps 0-1 and 2-3: bits 2f, 2f + 1 of byte t of a row's word,
// f = 2 (s % 2) + (high nibble), hold the top two bits of that code; Q3_K: then one 64-byte
// vector whose bit s of byte t of a row's word is the third bit of element 4s + t), and their
// half d (Q4_K / Q5_K / Q2_K: then dmin) per group and super-block of 256 in a second array, so
// they stay at 2.625 (Q2_K, as the file), 3.5625 (Q3_K), 4.625 (Q4_K) and 5.625 (Q5_K) (the
// file's 3.4375, 4.5 and 5.5 plus 4 bytes per 256: their 6-bit scales held a byte each) and
// 6.5625 (Q6_K, as the file) bits per weight.
//
//   DUET_ASSIGN_OR_RETURN(QuantWeights w, PackQuantWeights(QuantFormat::kQ4_1, gguf_bytes, n, k));
//   QuantScratch scratch;
//   QuantGemm(&pool, x, m, w, /*bias=*/nullptr, y, CpuIsa::kAvx2, &scratch);
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/thread_pool.h"
#include "common/compute/cpu/aligned.h"
#include "common/compute/cpu/cpu_isa.h"

namespace duet::compute::cpu {

enum class QuantFormat { kQ8_0, kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ4_K, kQ5_K, kQ6_K, kQ2_K, kQ3_K };

inline constexpr int kQuantBlock = 32;        // elements per block (k)
inline constexpr int kQuantSuperBlock = 256;  // elements per K-quant super-block
inline constexpr int kQuantGroupRows = 16;    // output rows per packed group

const char* QuantFormatName(QuantFormat format);
// Elements per GGUF block: 32, or 256 for the K-quants (k must be a multiple of it).
int QuantBlockElements(QuantFormat format);
// GGUF bytes per block: 34 (Q8_0), 18 (Q4_0), 20 (Q4_1), 22 (Q5_0), 24 (Q5_1), 144 (Q4_K),
// 176 (Q5_K), 210 (Q6_K), 84 (Q2_K), 110 (Q3_K).
int QuantBlockBytes(QuantFormat format);

struct QuantWeights {
  QuantFormat format = QuantFormat::kQ8_0;
  int n = 0;                  // output features
  int k = 0;                  // input features, a multiple of kQuantBlock
  int num_groups = 0;         // ceil(n / kQuantGroupRows); rows past n have zero scales and codes
  int blocks = 0;             // k / kQuantBlock
  int group_block_bytes = 0;  // bytes per (group, block of 32)
  int super_bytes = 0;        // K-quants: bytes per (group, super-block of 256); else 0
  std::unique_ptr<uint8_t[], AlignedFree> data;   // [num_groups][blocks][group_block_bytes]
  std::unique_ptr<uint8_t[], AlignedFree> super;  // [num_groups][blocks / 8][super_bytes]

  const uint8_t* GroupBlock(int g, int b) const {
    return data.get() + (static_cast<int64_t>(g) * blocks + b) * group_block_bytes;
  }
  // The super-block record block b of group g belongs to (K-quants only).
  const uint8_t* Super(int g, int b) const {
    return super.get() + (static_cast<int64_t>(g) * (blocks / 8) + b / 8) * super_bytes;
  }
  int64_t bytes() const {
    return static_cast<int64_t>(num_groups) * blocks * group_block_bytes +
           static_cast<int64_t>(num_groups) * (blocks / 8) * super_bytes;
  }
};

// Repacks `src`: n rows of k / QuantBlockElements GGUF blocks each (row-major, as in the file),
// groups of 16 rows in parallel on `pool` (may be null). InvalidArgument when k is not a multiple
// of the block or n, k <= 0; ResourceExhausted when allocation fails.
absl::StatusOr<QuantWeights> PackQuantWeights(QuantFormat format, const uint8_t* src, int n, int k,
                                              ThreadPool* pool = nullptr);

// Row `row` of dequant(w) into out[k] (x = (q - o) * d (+ m), in the order ggml dequantizes).
void DequantizeQuantRow(const QuantWeights& w, int row, float* out);

// The activation quantization of one row (exposed for tests): q[k], and per block d, the sum of
// q, the sum of its first 16 codes, and d * the sum.
void QuantizeActivationRow(const float* x, int k, int8_t* q, float* d, int32_t* sum,
                           int32_t* sum_lo, float* dsum);

// Scratch for the quantized activations, grown to the largest call (not thread-safe).
struct QuantScratch {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> sum;
  std::vector<int32_t> sum_lo;
  std::vector<float> dsum;
};

// y [m, w.n] = x [m, w.k] * dequant(w)^T (+ bias) on path `isa` (which the caller has checked
// the CPU runs; see cpu_isa.h). pool may be null.
void QuantGemm(ThreadPool* pool, const float* x, int m, const QuantWeights& w, const float* bias,
               float* y, CpuIsa isa, QuantScratch* scratch);

// One product of QuantGemmMany: y [m, w->n] = x * dequant(*w)^T (+ bias).
struct QuantProduct {
  const QuantWeights* w = nullptr;
  const float* bias = nullptr;
  float* y = nullptr;
};

// Several products of the same x (every w->k equal): x is quantized once and all their tiles
// share one parallel pass, so q, k and v (or gate and up) cost one fork and join instead of
// three. Each y is bitwise what QuantGemm gives for it alone.
void QuantGemmMany(ThreadPool* pool, const float* x, int m, const QuantProduct* products,
                   int count, CpuIsa isa, QuantScratch* scratch);

}  // namespace duet::compute::cpu
