// Internal to quant_gemm.cc and its per-ISA translation units: the tile kernels of QuantGemm.
// Each computes rows [0, rows) (rows <= kQuantTileRows) of the quantized activations against
// groups [g0, g1) of the packed weights and writes y (acc + bias, columns < w.n only).
#pragma once

#include <xmmintrin.h>

#include <cstdint>

#include "common/compute/cpu/quant_gemm.h"

namespace duet::compute::cpu::internal {

inline constexpr int kQuantTileRows = 4;
// Rows per tile of the AMX kernel, which runs full tiles only (the rest of a row block goes to
// the AVX-512 VNNI kernel: the same bits).
inline constexpr int kAmxTileRows = 16;

struct QuantActs {
  const int8_t* q;        // [rows][k]
  const float* d;         // [rows][blocks]
  const int32_t* sum;     // [rows][blocks]
  const int32_t* sum_lo;  // [rows][blocks]: the sum of each block's first 16 codes
  const float* dsum;      // [rows][blocks]
  int64_t ldq;            // k
  int64_t ldb;            // blocks
};

// The packed (group, block) layout of format F (quant_gemm.h). Blocks of 32: 16 half d at 0,
// then for the formats with a min 16 half m, then for the five-bit ones 16 words of fifth bits,
// then codes. K-quants: 32 bytes of integer scales (Q4_K / Q5_K: 16 sc, 16 m; Q6_K / Q3_K: 16
// per half; Q2_K: 16 per half, sc | m << 4), the codes (Q2_K / Q3_K: two 64-byte vectors of
// 2-bit fields, one per half), then for Q5_K 64 bytes of fifth bits, for Q6_K 128 bytes of high
// bit pairs, for Q3_K 64 bytes of third bits; per super-block 16 half d (Q4_K / Q5_K / Q2_K:
// then 16 half dmin).
constexpr bool IsKQuant(QuantFormat f) {
  return f == QuantFormat::kQ4_K || f == QuantFormat::kQ5_K || f == QuantFormat::kQ6_K ||
         f == QuantFormat::kQ2_K || f == QuantFormat::kQ3_K;
}
// The K-quants with a min per sub-block of 32 (x = (d * sc) q - dmin * m).
constexpr bool IsKQuantWithMin(QuantFormat f) {
  return f == QuantFormat::kQ4_K || f == QuantFormat::kQ5_K;
}
// The K-quants with a scale per half of 16 (Q6_K, Q3_K, Q2_K: one int32 sum per half).
constexpr bool HasHalfScales(QuantFormat f) {
  return f == QuantFormat::kQ6_K || f == QuantFormat::kQ3_K || f == QuantFormat::kQ2_K;
}
// Q2_K and Q3_K: codes in 2-bit fields, 16 k of one output per 32-bit word (field f of byte t
// holds k 4f + t of the word's half), Q3_K's third bit in a vector of its own.
constexpr bool IsLowBit(QuantFormat f) {
  return f == QuantFormat::kQ2_K || f == QuantFormat::kQ3_K;
}
constexpr bool HasMin(QuantFormat f) { return f == QuantFormat::kQ4_1 || f == QuantFormat::kQ5_1; }
constexpr bool HasFifthBit(QuantFormat f) {
  return f == QuantFormat::kQ5_0 || f == QuantFormat::kQ5_1 || f == QuantFormat::kQ5_K;
}
// The code offset o of x = (code - o) * d: 8 (Q4_0), 16 (Q5_0), 32 (Q6_K), 4 (Q3_K), else 0.
constexpr int CodeOffset(QuantFormat f) {
  return f == QuantFormat::kQ4_0   ? 8
         : f == QuantFormat::kQ5_0 ? 16
         : f == QuantFormat::kQ6_K ? 32
         : f == QuantFormat::kQ3_K ? 4
                                   : 0;
}
constexpr int MinsOffset() { return 32; }
// The K-quants' bits above the nibbles (Q5_K's fifth, Q6_K's top two) follow their codes;
// Q3_K's third bits follow its 128 bytes of 2-bit fields.
constexpr int KHighBitsOffset() { return 32 + 256; }
constexpr int Q3HighBitsOffset() { return 32 + 128; }
constexpr int FifthBitsOffset(QuantFormat f) {
  return IsKQuant(f) ? KHighBitsOffset() : HasMin(f) ? 64 : 32;
}
constexpr int CodesOffset(QuantFormat f) {
  return IsKQuant(f) ? 32 : FifthBitsOffset(f) + (HasFifthBit(f) ? 64 : 0);
}
// Bytes per (group, block of 32) and per (group, super-block).
constexpr int GroupBlockBytes(QuantFormat f) {
  return f == QuantFormat::kQ4_K   ? 32 + 256
         : f == QuantFormat::kQ5_K ? 32 + 256 + 64
         : f == QuantFormat::kQ6_K ? 32 + 256 + 128
         : f == QuantFormat::kQ2_K ? 32 + 128
         : f == QuantFormat::kQ3_K ? 32 + 128 + 64
         : f == QuantFormat::kQ8_0 ? 32 + 512
                                   : CodesOffset(f) + 256;
}
constexpr int SuperBytes(QuantFormat f) {
  return IsKQuantWithMin(f) || f == QuantFormat::kQ2_K ? 64 : IsKQuant(f) ? 32 : 0;
}

// The helpers below are static: each per-ISA translation unit keeps its own copy, compiled
// for its instruction set, which the linker cannot hand to another path.

// Writes the 16 accumulators of one (row, group) to y: y[j] = acc[j] (+ bias[j]), j < valid.
static inline void StoreGroupRow(const float* acc, int g, int n, const float* bias, float* y_row) {
  const int col0 = g * kQuantGroupRows;
  const int valid = n - col0 < kQuantGroupRows ? n - col0 : kQuantGroupRows;
  for (int j = 0; j < valid; ++j) {
    y_row[col0 + j] = bias != nullptr ? acc[j] + bias[col0 + j] : acc[j];
  }
}

// How far ahead the AVX-512 kernel's one- and two-row tiles prefetch the packed blocks: each
// work item reads its groups' blocks as one stream ([group][block] in order), and at decode,
// where a block serves one or two rows, the hardware prefetcher starts too late there. (The
// AVX2 kernel, which reads each block twice, half a group at a time, measured no better with
// it; benchmarks.md.)
inline constexpr int kQuantPrefetchBlocks = 8;

// Prefetches the group block kQuantPrefetchBlocks after gb (a hint: past the end is harmless).
static inline void PrefetchAhead(const QuantWeights& w, const uint8_t* gb) {
  const uint8_t* ahead = gb + kQuantPrefetchBlocks * w.group_block_bytes;
  for (int line = 0; line < w.group_block_bytes; line += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(ahead + line), _MM_HINT_T0);
  }
}

// Calls fn.template operator()<F>() with F == format, a compile-time constant there.
template <typename Fn>
void WithQuantFormat(QuantFormat format, Fn&& fn) {
  switch (format) {
    case QuantFormat::kQ8_0:
      return fn.template operator()<QuantFormat::kQ8_0>();
    case QuantFormat::kQ4_0:
      return fn.template operator()<QuantFormat::kQ4_0>();
    case QuantFormat::kQ4_1:
      return fn.template operator()<QuantFormat::kQ4_1>();
    case QuantFormat::kQ5_0:
      return fn.template operator()<QuantFormat::kQ5_0>();
    case QuantFormat::kQ5_1:
      return fn.template operator()<QuantFormat::kQ5_1>();
    case QuantFormat::kQ4_K:
      return fn.template operator()<QuantFormat::kQ4_K>();
    case QuantFormat::kQ5_K:
      return fn.template operator()<QuantFormat::kQ5_K>();
    case QuantFormat::kQ6_K:
      return fn.template operator()<QuantFormat::kQ6_K>();
    case QuantFormat::kQ2_K:
      return fn.template operator()<QuantFormat::kQ2_K>();
    case QuantFormat::kQ3_K:
      return fn.template operator()<QuantFormat::kQ3_K>();
  }
}

// Calls Kernel::Run<format, rows>(w, a, g0, g1, bias, y, ldy) for the runtime format and rows
// (each ISA's translation unit instantiates it with its own kernel type).
template <typename Kernel>
void DispatchQuantTile(const QuantWeights& w, const QuantActs& a, int rows, int g0, int g1,
                       const float* bias, float* y, int64_t ldy) {
  WithQuantFormat(w.format, [&]<QuantFormat F>() {
    switch (rows) {
      case 1:
        return Kernel::template Run<F, 1>(w, a, g0, g1, bias, y, ldy);
      case 2:
        return Kernel::template Run<F, 2>(w, a, g0, g1, bias, y, ldy);
      case 3:
        return Kernel::template Run<F, 3>(w, a, g0, g1, bias, y, ldy);
      default:
        return Kernel::template Run<F, 4>(w, a, g0, g1, bias, y, ldy);
    }
  });
}

using QuantTileFn = void (*)(const QuantWeights& w, const QuantActs& a, int rows, int g0, int g1,
                             const float* bias, float* y, int64_t ldy);

// QuantizeActivationRow with AVX2: the same codes, scales and sums bit for bit.
void QuantizeActivationRowAvx2(const float* x, int k, int8_t* q, float* d, int32_t* sum,
                               int32_t* sum_lo, float* dsum);

void QuantTileScalar(const QuantWeights& w, const QuantActs& a, int rows, int g0, int g1,
                     const float* bias, float* y, int64_t ldy);
void QuantTileAvx2(const QuantWeights& w, const QuantActs& a, int rows, int g0, int g1,
                   const float* bias, float* y, int64_t ldy);
void QuantTileAvx512Vnni(const QuantWeights& w, const QuantActs& a, int rows, int g0, int g1,
                         const float* bias, float* y, int64_t ldy);
// Exactly kAmxTileRows rows (a.q holds them all). Q2_K and Q3_K run on the AVX-512 VNNI
// kernel, four rows at a time (the same bits).
void QuantTileAmx(const QuantWeights& w, const QuantActs& a, int g0, int g1, const float* bias,
                  float* y, int64_t ldy);

}  // namespace duet::compute::cpu::internal
