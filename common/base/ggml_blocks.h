// ggml's quantized blocks decoded to their integer codes and scales, the one place their bit
// layouts are spelled out for both the GGUF dequantizer (common/weights/gguf_quant.cc,
// gguf_kquant.cc) and the CPU backend's packer of weights it keeps quantized
// (common/compute/cpu/quant_gemm.cc). gguf_quant.h documents each layout.
//
//   int codes[32];
//   Q5Codes(block + 6, qh, codes);          // Q5_0: codes[j] in [0, 31], x = (codes[j] - 16) * d
//   KQuant4 k;
//   DecodeQ4K(block, &k);                   // x[i] = (d * k.scale[i / 32]) * k.codes[i] - ...
//   KQuant2 k2;
//   DecodeQ2K(block, &k2);                  // x[i] = (d * k2.scale[i / 16]) * k2.codes[i] - ...
#pragma once

#include <cstdint>
#include <cstring>

namespace duet {

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The 5-bit codes of one Q5_0 / Q5_1 block's element j: the nibbles qs (16 bytes) and the fifth
// bits qh, codes[j] in [0, 31] in element order.
inline void Q5Codes(const uint8_t* qs, uint32_t qh, int codes[32]) {
  for (int j = 0; j < 16; ++j) {
    codes[j] = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    codes[j + 16] = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
  }
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block's 12 scale bytes s: for
// j < 4 the low 6 bits of s[j] and s[j + 4]; for j >= 4 a nibble of s[j + 4] with the top two
// bits of s[j - 4] (scale) and s[j] (min) as bits 4-5.
inline void KQuantScaleMin(const uint8_t* s, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// One Q4_K (144 bytes) or Q5_K (176 bytes) super-block of 256 elements in eight sub-blocks of
// 32: x[i] = (d * scale[i / 32]) * codes[i] - dmin * min[i / 32], d and dmin IEEE halves.
struct KQuant4 {
  uint16_t d, dmin;
  int scale[8], min[8];  // 0..63
  int codes[256];        // Q4_K 0..15, Q5_K 0..31
};

// Element 64c + 32k + l (c < 4, k < 2, l < 32) is nibble k of qs[32c + l], plus 16 when bit
// 2c + k of qh[l] is set (qh null: Q4_K, no fifth bit). `src` is the block (d, dmin, scales).
inline void DecodeQ4KOrQ5K(const uint8_t* src, const uint8_t* qh, const uint8_t* qs, KQuant4* out) {
  out->d = LoadU16(src);
  out->dmin = LoadU16(src + 2);
  for (int j = 0; j < 8; ++j) KQuantScaleMin(src + 4, j, &out->scale[j], &out->min[j]);
  for (int c = 0; c < 4; ++c) {
    for (int k = 0; k < 2; ++k) {
      for (int l = 0; l < 32; ++l) {
        int q = (qs[32 * c + l] >> (4 * k)) & 0x0f;
        if (qh != nullptr) q |= ((qh[l] >> (2 * c + k)) & 1) << 4;
        out->codes[64 * c + 32 * k + l] = q;
      }
    }
  }
}
inline void DecodeQ4K(const uint8_t* src, KQuant4* out) {
  DecodeQ4KOrQ5K(src, nullptr, src + 16, out);
}
inline void DecodeQ5K(const uint8_t* src, KQuant4* out) {
  DecodeQ4KOrQ5K(src, src + 16, src + 48, out);
}

// One Q2_K super-block (84 bytes: scales[16] (low nibble scale, high nibble min), qs[64], d,
// dmin) of 256 elements in sixteen sub-blocks of 16:
// x[i] = (d * scale[i / 16]) * codes[i] - dmin * min[i / 16].
struct KQuant2 {
  uint16_t d, dmin;
  int scale[16], min[16];  // 0..15
  int codes[256];          // 0..3
};

// Element 128h + 32s + l (h < 2, s < 4, l < 32) is bits 2s, 2s + 1 of qs[32h + l].
inline void DecodeQ2K(const uint8_t* src, KQuant2* out) {
  const uint8_t* qs = src + 16;
  for (int j = 0; j < 16; ++j) out->scale[j] = src[j] & 0x0f, out->min[j] = src[j] >> 4;
  out->d = LoadU16(src + 80);
  out->dmin = LoadU16(src + 82);
  for (int h = 0; h < 2; ++h) {
    for (int s = 0; s < 4; ++s) {
      for (int l = 0; l < 32; ++l) {
        out->codes[128 * h + 32 * s + l] = (qs[32 * h + l] >> (2 * s)) & 3;
      }
    }
  }
}

// One Q6_K super-block (210 bytes: ql[128], qh[64], int8 scales[16], d) of 256 elements in
// sixteen sub-blocks of 16: x[i] = (d * scale[i / 16]) * (codes[i] - 32).
struct KQuant6 {
  uint16_t d;
  int scale[16];   // -128..127
  int codes[256];  // 0..63
};

// Element 128h + 32s + l (h < 2, s < 4, l < 32): its low 4 bits are nibble s / 2 of
// ql[64h + 32(s % 2) + l], its high 2 bits are bits 2s, 2s + 1 of qh[32h + l].
inline void DecodeQ6K(const uint8_t* src, KQuant6* out) {
  const uint8_t* ql = src;
  const uint8_t* qh = src + 128;
  for (int j = 0; j < 16; ++j) out->scale[j] = static_cast<int8_t>(src[192 + j]);
  out->d = LoadU16(src + 208);
  for (int h = 0; h < 2; ++h) {
    for (int s = 0; s < 4; ++s) {
      for (int l = 0; l < 32; ++l) {
        const int lo = (ql[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0x0f;
        const int hi = (qh[32 * h + l] >> (2 * s)) & 3;
        out->codes[128 * h + 32 * s + l] = lo | (hi << 4);
      }
    }
  }
}

// The inverse of DecodeQ6K: the 210 bytes of k (codes 0..63, scales -128..127). Tests write
// Q6_K blocks with it (e.g. Q3_K's values as Q6_K, which the Q3_K kernels must match bit for bit).
inline void EncodeQ6K(const KQuant6& k, uint8_t* dst) {
  uint8_t* ql = dst;
  uint8_t* qh = dst + 128;
  std::memset(dst, 0, 192);
  for (int h = 0; h < 2; ++h) {
    for (int s = 0; s < 4; ++s) {
      for (int l = 0; l < 32; ++l) {
        const int c = k.codes[128 * h + 32 * s + l];
        ql[64 * h + 32 * (s % 2) + l] |= static_cast<uint8_t>((c & 0x0f) << (4 * (s / 2)));
        qh[32 * h + l] |= static_cast<uint8_t>(((c >> 4) & 3) << (2 * s));
      }
    }
  }
  for (int j = 0; j < 16; ++j) dst[192 + j] = static_cast<uint8_t>(static_cast<int8_t>(k.scale[j]));
  std::memcpy(dst + 208, &k.d, 2);
}

// One Q3_K super-block (110 bytes: hmask[32], qs[64], scales[12] (sixteen 6-bit values), d) as
// the Q6_K values it holds: x[i] = (d * (sc[i / 16] - 32)) * q[i] with q in -4..3, here as
// scale = sc - 32 (-32..31) and codes = q + 32 (28..35), so that DecodeQ6K's formula gives the
// same products. Element 128h + 32s + l: q = bits 2s, 2s + 1 of qs[32h + l], minus 4 where bit
// 4h + s of hmask[l] is clear; sub-block j's sc: its low 4 bits are nibble j / 8 of s[j % 8],
// its high 2 bits are bits 2 (j / 4) and up of s[8 + j % 4].
inline void DecodeQ3KAsQ6K(const uint8_t* src, KQuant6* out) {
  const uint8_t* hmask = src;
  const uint8_t* qs = src + 32;
  const uint8_t* s = src + 96;
  for (int j = 0; j < 16; ++j) {
    out->scale[j] =
        (((s[j % 8] >> (4 * (j / 8))) & 0x0f) | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
  }
  out->d = LoadU16(src + 108);
  for (int h = 0; h < 2; ++h) {
    for (int sb = 0; sb < 4; ++sb) {
      for (int l = 0; l < 32; ++l) {
        const int q =
            ((qs[32 * h + l] >> (2 * sb)) & 3) - (((hmask[l] >> (4 * h + sb)) & 1) ? 0 : 4);
        out->codes[128 * h + 32 * sb + l] = q + 32;
      }
    }
  }
}

}  // namespace duet
