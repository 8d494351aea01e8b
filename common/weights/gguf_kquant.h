// Dequantisation of ggml's K-quant super-blocks (256 elements each) to float32; the layouts are
// documented in gguf_quant.h. Callers normally go through DequantizeBlocks, which checks the
// type and the element count first.
//
//   DequantizeQ4K(src, n / 256, dst);   // src: n / 256 blocks of 144 bytes, any alignment
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

}  // namespace duet::model
