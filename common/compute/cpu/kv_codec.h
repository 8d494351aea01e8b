// How the CPU backend stores one token's K (or V) in each KV dtype, and reads it back as f32.
// One definition of the quantization, shared by the KV write, attention and the tests:
//   f32, bf16, f16: each element converted (bf16/f16 round to nearest even);
//   int8: per kv head, scale = max|x| / 127, code = round-to-nearest-even(x / scale) in
//         [-127, 127];
//   fp8 (e4m3): per kv head, scale = max|x| / 448, code = FloatToFp8E4M3(x / scale);
//   a head of all zeros has scale 0 and codes 0. Decoded element = code * scale (one rounding).
// Each token is quantized on its own, when it is written: its codes never change afterwards,
// whatever is written later to its block (prefix caching and batch invariance rely on it).
// The SIMD and portable decoders give the same bits.
//
//   EncodeKvToken(layout.dtype, x, nkv, d, codes, scales);   // x: [nkv * d]
//   DecodeKvHead(layout.dtype, codes + h * d * bytes, scales[h], d, row);
#pragma once

#include <cstdint>

#include "common/kv/kv_layout.h"

namespace duet::compute::cpu {

// Encodes x [num_kv_heads * head_dim] into `codes` (num_kv_heads * head_dim elements of the
// dtype) and, for int8/fp8, `scales` [num_kv_heads] (ignored, may be null, otherwise).
void EncodeKvToken(kv::KvDtype dtype, const float* x, int num_kv_heads, int head_dim, void* codes,
                   float* scales);

// Decodes one head's `head_dim` codes (scaled by `scale` for int8/fp8) into out.
void DecodeKvHead(kv::KvDtype dtype, const void* codes, float scale, int head_dim, float* out);
void DecodeKvHeadPortable(kv::KvDtype dtype, const void* codes, float scale, int head_dim,
                          float* out);

// Decodes `n` rows of one head: row i's codes at codes + i * code_stride bytes, its scale at
// scales[i * scale_stride] (int8/fp8; ignored otherwise), into out + i * head_dim. The same bits
// as DecodeKvHead row by row, with the dtype dispatched once (attention's inner loop).
void DecodeKvRows(kv::KvDtype dtype, const uint8_t* codes, int64_t code_stride, const float* scales,
                  int64_t scale_stride, int n, int head_dim, float* out);

}  // namespace duet::compute::cpu
