// Dequantisation of ggml's K-quant super-blocks (256 elements each) to float32; the layouts are
// documented in gguf_quant.h. Callers normally go through DequantizeBlocks, which checks the
// type and the element count first.
//
//   DequantizeQ4K(src, n / 256, dst);   // src: n / 256 blocks of 144 bytes, any alignment
//   TranscodeQ3KToQ6K(src, n / 256, dst);   // dst: n / 256 blocks of 210 bytes
#pragma once

#include <cstdint>

namespace duet::model {

inline constexpr int64_t kKQuantBlock = 256;  // elements per K-quant super-block

// Each reads `blocks` whole blocks from src and writes 256 * blocks floats to dst.
void DequantizeQ2K(const uint8_t* src, int64_t blocks, float* dst);
void DequantizeQ3K(const uint8_t* src, int64_t blocks, float* dst);
void DequantizeQ4K(const uint8_t* src, int64_t blocks, float* dst);
void DequantizeQ5K(const uint8_t* src, int64_t blocks, float* dst);
void DequantizeQ6K(const uint8_t* src, int64_t blocks, float* dst);
void DequantizeQ8K(const uint8_t* src, int64_t blocks, float* dst);

// Rewrites `blocks` Q3_K blocks (110 bytes) as Q6_K blocks (210 bytes) holding the same values
// bit for bit (DequantizeQ6K of dst equals DequantizeQ3K of src): Q3_K's codes -4..3 and 6-bit
// scales are within Q6_K's ranges, under the same half d. What `--weights_dtype native` keeps a
// Q3_K matrix as, so that the Q6_K kernels multiply it: 6.5625 bits per weight instead of 3.4375.
void TranscodeQ3KToQ6K(const uint8_t* src, int64_t blocks, uint8_t* dst);

}  // namespace duet::model
