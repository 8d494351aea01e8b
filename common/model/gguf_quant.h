// ggml tensor types: block geometry and dequantisation to float32 for the types GGUF llama
// checkpoints commonly hold (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
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
