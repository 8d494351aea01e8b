#include "common/weights/gguf_quant.h"

#include <cstring>
#include <string>

#include "common/base/float16.h"
#include "common/base/ggml_blocks.h"
#include "common/weights/gguf_kquant.h"

namespace duet::model {
namespace {

constexpr GgmlTypeInfo kTypes[] = {
    {0, "F32", 1, 4, true},       {1, "F16", 1, 2, true},       {2, "Q4_0", 32, 18, true},
    {3, "Q4_1", 32, 20, true},    {6, "Q5_0", 32, 22, true},    {7, "Q5_1", 32, 24, true},
    {8, "Q8_0", 32, 34, true},    {9, "Q8_1", 32, 36, false},   {10, "Q2_K", 256, 84, true},
    {11, "Q3_K", 256, 110, true}, {12, "Q4_K", 256, 144, true}, {13, "Q5_K", 256, 176, true},
    {14, "Q6_K", 256, 210, true}, {15, "Q8_K", 256, 292, true}, {24, "I8", 1, 1, false},
    {25, "I16", 1, 2, false},     {26, "I32", 1, 4, false},     {27, "I64", 1, 8, false},
    {28, "F64", 1, 8, false},     {30, "BF16", 1, 2, true},
};

// The 16 nibble bytes of a 4/5-bit block: element j comes from the low nibble of q[j], element
// j + 16 from its high nibble; `hi` holds the fifth bits (bit j for element j) or 0.
// x = (q - sub) * d + m, in ggml's order of operations.
inline void Nibbles(const uint8_t* q, uint32_t hi, bool has_hi, int sub, float d, float m,
                    float* dst) {
  int codes[32];
  if (has_hi) {
    Q5Codes(q, hi, codes);
  } else {
    for (int j = 0; j < 16; ++j) codes[j] = q[j] & 0x0f, codes[j + 16] = q[j] >> 4;
  }
  for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(codes[j] - sub) * d + m;
}

}  // namespace

const GgmlTypeInfo* FindGgmlType(uint32_t type) {
  for (const GgmlTypeInfo& t : kTypes) {
    if (t.type == type) return &t;
  }
  return nullptr;
}

absl::Status DequantizeBlocks(uint32_t type, const uint8_t* src, int64_t n, float* dst) {
  const GgmlTypeInfo* info = FindGgmlType(type);
  if (info == nullptr || !info->can_dequantize) {
    return absl::InvalidArgumentError(std::string("cannot dequantize ggml type ") +
                                      (info ? info->name : std::to_string(type)) +
                                      "; supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, "
                                      "Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K");
  }
  if (n < 0 || n % info->block_size != 0) {
    return absl::InvalidArgumentError(std::string(info->name) + ": " + std::to_string(n) +
                                      " elements is not a multiple of the block size " +
                                      std::to_string(info->block_size));
  }
  const int64_t blocks = n / info->block_size;
  switch (static_cast<int>(type)) {
    case 0:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return absl::OkStatus();
    case 1:
      for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(LoadU16(src + 2 * i));
      return absl::OkStatus();
    case 30:
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(LoadU16(src + 2 * i));
      return absl::OkStatus();
    case 2:  // Q4_0
      for (int64_t b = 0; b < blocks; ++b, src += 18, dst += 32) {
        const float d = HalfToFloat(LoadU16(src));
        Nibbles(src + 2, 0, false, 8, d, 0.0f, dst);
      }
      return absl::OkStatus();
    case 3:  // Q4_1
      for (int64_t b = 0; b < blocks; ++b, src += 20, dst += 32) {
        Nibbles(src + 4, 0, false, 0, HalfToFloat(LoadU16(src)), HalfToFloat(LoadU16(src + 2)),
                dst);
      }
      return absl::OkStatus();
    case 6:  // Q5_0
      for (int64_t b = 0; b < blocks; ++b, src += 22, dst += 32) {
        const float d = HalfToFloat(LoadU16(src));
        Nibbles(src + 6, LoadU32(src + 2), true, 16, d, 0.0f, dst);
      }
      return absl::OkStatus();
    case 7:  // Q5_1
      for (int64_t b = 0; b < blocks; ++b, src += 24, dst += 32) {
        Nibbles(src + 8, LoadU32(src + 4), true, 0, HalfToFloat(LoadU16(src)),
                HalfToFloat(LoadU16(src + 2)), dst);
      }
      return absl::OkStatus();
    case 8:  // Q8_0
      for (int64_t b = 0; b < blocks; ++b, src += 34, dst += 32) {
        const float d = HalfToFloat(LoadU16(src));
        for (int j = 0; j < 32; ++j)
          dst[j] = static_cast<float>(static_cast<int8_t>(src[2 + j])) * d;
      }
      return absl::OkStatus();
    case 10:
      DequantizeQ2K(src, blocks, dst);
      return absl::OkStatus();
    case 11:
      DequantizeQ3K(src, blocks, dst);
      return absl::OkStatus();
    case 12:
      DequantizeQ4K(src, blocks, dst);
      return absl::OkStatus();
    case 13:
      DequantizeQ5K(src, blocks, dst);
      return absl::OkStatus();
    case 14:
      DequantizeQ6K(src, blocks, dst);
      return absl::OkStatus();
    case 15:
      DequantizeQ8K(src, blocks, dst);
      return absl::OkStatus();
  }
  return absl::InternalError("unreachable ggml type");
}

}  // namespace duet::model
