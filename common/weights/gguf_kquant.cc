// K-quant dequantisation, in ggml's order of operations: x = (d * sc) * q - dmin * m. With half
// d and dmin (11 significant bits) and integers of at most 7 bits (sc, m) and 6 bits (q), every
// product is exact in float, so only the final subtraction rounds: the results are bit for bit
// ggml's whatever the order of the products and whether the compiler fuses them into an FMA.
// Q8_K's float d times q rounds once.
#include "common/weights/gguf_kquant.h"

#include <cstring>

#include "common/base/float16.h"
#include "common/base/ggml_blocks.h"

namespace duet::model {
namespace {

inline float LoadHalf(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return HalfToFloat(v);
}

inline float ToFloat(int v) { return static_cast<float>(v); }

// Q4_K and Q5_K (qh null for Q4_K; ggml_blocks.h has the element order).
void FourOrFiveBit(const uint8_t* src, const uint8_t* qh, const uint8_t* qs, float* dst) {
  KQuant4 k;
  DecodeQ4KOrQ5K(src, qh, qs, &k);
  const float d = HalfToFloat(k.d);
  const float dmin = HalfToFloat(k.dmin);
  for (int j = 0; j < 8; ++j) {
    const float dl = d * ToFloat(k.scale[j]);
    const float ml = dmin * ToFloat(k.min[j]);
    for (int l = 0; l < 32; ++l) dst[32 * j + l] = dl * ToFloat(k.codes[32 * j + l]) - ml;
  }
}

// x = (d * scale) * (code - 32) over the sixteen sub-blocks of 16 (Q6_K, and Q3_K decoded as
// Q6_K).
void SixBit(const KQuant6& k, float* dst) {
  const float d = HalfToFloat(k.d);
  for (int j = 0; j < 16; ++j) {
    const float dl = d * ToFloat(k.scale[j]);
    for (int l = 16 * j; l < 16 * j + 16; ++l) dst[l] = dl * ToFloat(k.codes[l] - 32);
  }
}

}  // namespace

// 84 bytes: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin (ggml_blocks.h).
void DequantizeQ2K(const uint8_t* src, int64_t blocks, float* dst) {
  KQuant2 k;
  for (int64_t b = 0; b < blocks; ++b, src += 84, dst += kKQuantBlock) {
    DecodeQ2K(src, &k);
    const float d = HalfToFloat(k.d);
    const float dmin = HalfToFloat(k.dmin);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * ToFloat(k.scale[j]);
      const float ml = dmin * ToFloat(k.min[j]);
      for (int l = 16 * j; l < 16 * j + 16; ++l) dst[l] = dl * ToFloat(k.codes[l]) - ml;
    }
  }
}

// 110 bytes: hmask[32], qs[64], scales[12] (sixteen 6-bit values), d; decoded as the Q6_K
// values they hold (ggml_blocks.h), so x = (d * (sc - 32)) * q as ggml computes it.
void DequantizeQ3K(const uint8_t* src, int64_t blocks, float* dst) {
  KQuant6 k;
  for (int64_t b = 0; b < blocks; ++b, src += 110, dst += kKQuantBlock) {
    DecodeQ3KAsQ6K(src, &k);
    SixBit(k, dst);
  }
}

// 144 bytes: d, dmin, scales[12] (eight 6-bit scale/min pairs), qs[128].
void DequantizeQ4K(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, src += 144, dst += kKQuantBlock) {
    FourOrFiveBit(src, nullptr, src + 16, dst);
  }
}

// 176 bytes: d, dmin, scales[12], qh[32], qs[128].
void DequantizeQ5K(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, src += 176, dst += kKQuantBlock) {
    FourOrFiveBit(src, src + 16, src + 48, dst);
  }
}

// 210 bytes: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], d.
void DequantizeQ6K(const uint8_t* src, int64_t blocks, float* dst) {
  KQuant6 k;
  for (int64_t b = 0; b < blocks; ++b, src += 210, dst += kKQuantBlock) {
    DecodeQ6K(src, &k);
    SixBit(k, dst);
  }
}

// 292 bytes: float32 d, int8 qs[256], int16 bsums[16] (sums of 16 qs each; not needed here).
void DequantizeQ8K(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, src += 292, dst += kKQuantBlock) {
    float d;
    std::memcpy(&d, src, 4);
    for (int j = 0; j < 256; ++j) dst[j] = d * ToFloat(static_cast<int8_t>(src[4 + j]));
  }
}

}  // namespace duet::model
