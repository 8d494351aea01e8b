// Integer-dot-product GEMM on weights kept in their GGUF block format (Q8_0, Q4_0, Q4_1):
// y[m, n] = x[m, k] * dequant(w)[n, k]^T (+ bias[n]).
//
// Each activation row is quantized on its own to int8 blocks of 32 (Q8_0-style: d = amax / 127,
// q = round-to-nearest-even(x / d), clamped to +-127; and the block's sum of q), so a row's codes
// depend on nothing but that row. Per output element and weight block b the kernel forms the
// block's exact int32 dot product isum_b of the codes and accumulates, for b = 0, 1, ... in
// order, starting from 0:
//   Q8_0:  acc = fma(dw_b * dx_b, isum_b, acc)              (isum_b = sum qw * qx)
//   Q4_0:  acc = fma(dw_b * dx_b, isum_b, acc)              (isum_b = sum nibble * qx - 8 sum qx)
//   Q4_1:  acc = fma(dw_b * dx_b, isum_b, acc); acc = fma(mw_b, dx_b * sum qx, acc)
// then y = acc + bias. Integer sums are exact and every float step is the same in every code
// path (scalar, AVX2, AVX-512, AVX-512 VNNI), so a row's result is bitwise independent of the
// other rows of the call, of the thread count and of the CPU path.
//
// Weights are repacked once (same bytes per element as the GGUF blocks) into groups of 16 output
// rows: for group g and block b, the 16 half scales d (Q4_1: then the 16 half mins m), then the
// codes with four consecutive k of one row per 32-bit lane (Q8_0: 8 steps of 4 k; Q4_x: 4 steps
// of 8 k, k..k+3 in the low nibbles and k+4..k+7 in the high ones), so one broadcast 32-bit
// activation word feeds 16 outputs and no horizontal sum is needed.
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

enum class QuantFormat { kQ8_0, kQ4_0, kQ4_1 };

inline constexpr int kQuantBlock = 32;      // elements per block (k)
inline constexpr int kQuantGroupRows = 16;  // output rows per packed group

const char* QuantFormatName(QuantFormat format);
// GGUF bytes per block of 32: 34 (Q8_0), 18 (Q4_0), 20 (Q4_1).
int QuantBlockBytes(QuantFormat format);

struct QuantWeights {
  QuantFormat format = QuantFormat::kQ8_0;
  int n = 0;                  // output features
  int k = 0;                  // input features, a multiple of kQuantBlock
  int num_groups = 0;         // ceil(n / kQuantGroupRows); rows past n have zero scales and codes
  int blocks = 0;             // k / kQuantBlock
  int group_block_bytes = 0;  // 16 * QuantBlockBytes(format)
  std::unique_ptr<uint8_t[], AlignedFree> data;  // [num_groups][blocks][group_block_bytes]

  const uint8_t* GroupBlock(int g, int b) const {
    return data.get() + (static_cast<int64_t>(g) * blocks + b) * group_block_bytes;
  }
  int64_t bytes() const { return static_cast<int64_t>(num_groups) * blocks * group_block_bytes; }
};

// Repacks `src`: n rows of k / 32 GGUF blocks each (row-major, as in the file). InvalidArgument
// when k is not a multiple of 32 or n, k <= 0; ResourceExhausted when allocation fails.
absl::StatusOr<QuantWeights> PackQuantWeights(QuantFormat format, const uint8_t* src, int n, int k);

// Row `row` of dequant(w) into out[k] (x = d * q (- 8 d) (+ m), in the order ggml dequantizes).
void DequantizeQuantRow(const QuantWeights& w, int row, float* out);

// The activation quantization of one row (exposed for tests): q[k], and per block d, the sum of
// q and d * that sum.
void QuantizeActivationRow(const float* x, int k, int8_t* q, float* d, int32_t* sum, float* dsum);

// Scratch for the quantized activations, grown to the largest call (not thread-safe).
struct QuantScratch {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> sum;
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
