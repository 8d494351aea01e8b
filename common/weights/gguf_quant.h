// ggml tensor types: block geometry and dequantisation to float32 for the types GGUF llama
// checkpoints commonly hold (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K; the K-quants live in gguf_kquant.cc).
//
//   const GgmlTypeInfo* info = FindGgmlType(t.type);       // nullptr: unknown type number
//   if (info && info->can_dequantize) DequantizeBlocks(t.type, t.data, n, out);
//
// Block layouts (little-endian, as written by ggml; d and m are IEEE halves):
//   Q4_0: d, 16 bytes of nibbles          x[j] = (lo(q[j]) - 8) * d, x[j+16] = (hi(q[j]) - 8) * d
//   Q4_1: d, m, 16 bytes of nibbles       x[j] = lo(q[j]) * d + m,   x[j+16] = hi(q[j]) * d + m
//   Q5_0: d, 4 bytes high bits, 16 bytes  as Q4_0 with a fifth bit from qh, offset 16
//   Q5_1: d, m, 4 bytes high bits, 16     as Q4_1 with a fifth bit from qh
//   Q8_0: d, 32 int8                      x[j] = q[j] * d
// K-quants: 256-element super-blocks of 16- or 32-element sub-blocks, each with its own integer
// scale (and min) under the block's half d (and dmin); x = (d * sc) * q - dmin * m (the products
// are exact in float; only the subtraction rounds). Below, element e = 128h + 32s + l (h < 2,
// s < 4, l < 32) and its 16-element sub-block is j = 8h + 2s + l / 16.
//   Q2_K (84 bytes): scales[16], qs[64], d, dmin
//     q = (qs[32h + l] >> 2s) & 3; x = (d * (scales[j] & 15)) * q - dmin * (scales[j] >> 4)
//   Q3_K (110): hmask[32], qs[64], scales[12] (sixteen 6-bit), d
//     sc = nibble j / 8 of scales[j % 8] | ((scales[8 + j % 4] >> 2 * (j / 4)) & 3) << 4
//     q = ((qs[32h + l] >> 2s) & 3) - (bit 4h + s of hmask[l] ? 0 : 4); x = (d * (sc - 32)) * q
//   Q4_K (144): d, dmin, scales[12] (eight 6-bit scale/min pairs), qs[128]
//     element 64c + 32k + l (c < 4, k < 2) is nibble k (low first) of qs[32c + l], in
//     32-element sub-block i = 2c + k; x = (d * sc[i]) * q - dmin * m[i] where for i < 4
//     sc = scales[i] & 63, m = scales[i + 4] & 63, and for i >= 4
//     sc = (scales[i + 4] & 15) | (scales[i - 4] >> 6) << 4,
//     m = (scales[i + 4] >> 4) | (scales[i] >> 6) << 4
//   Q5_K (176): d, dmin, scales[12], qh[32], qs[128]   as Q4_K, q += 16 * (bit i of qh[l])
//   Q6_K (210): ql[128], qh[64], int8 scales[16], d
//     q = (nibble s / 2 of ql[64h + 32(s % 2) + l] | ((qh[32h + l] >> 2s) & 3) << 4) - 32
//     x = (d * scales[j]) * q
//   Q8_K (292): float32 d, int8 qs[256], int16 bsums[16] (sums of 16 qs; unused)  x = d * qs[e]
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace duet::model {

struct GgmlTypeInfo {
  uint32_t type;
  const char* name;
  int64_t block_size;  // elements per block
  size_t type_size;    // bytes per block
  bool can_dequantize;
};

// nullptr for a type number this reader does not know.
const GgmlTypeInfo* FindGgmlType(uint32_t type);

// Dequantises n elements (a multiple of the block size) starting at src (any alignment).
// InvalidArgument for an unsupported type or a partial block.
absl::Status DequantizeBlocks(uint32_t type, const uint8_t* src, int64_t n, float* dst);

}  // namespace duet::model
