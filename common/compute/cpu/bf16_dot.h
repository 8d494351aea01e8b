// vdpbf16ps's arithmetic, shared by the CPU kernels that run on bf16 dot products (attention on
// bf16 K/V, the GEMM's bf16 pairs): a 32-bit word holds two bf16, element 2i in its low half and
// 2i + 1 in its high half, and one dot step is acc = fma(lo(a), lo(b), fma(hi(a), hi(b), acc))
// with denormal operands read as zero and denormal results flushed. The products of two bf16
// are exact in a float, so the fmas only round the sums; paths without the instruction run the
// two fmas under DenormalsFlushed and give its bits.
//
//   DenormalsFlushed flushed;                      // DAZ | FTZ for this scope
//   float acc = ScalarDotPair(0.f, Bf16Word(x0, x1), Bf16Word(w0, w1));
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "common/base/float16.h"

namespace duet::compute::cpu::internal {

// The word of two bf16 that the bf16 kernels take: FloatToBf16(lo) | FloatToBf16(hi) << 16.
inline uint32_t Bf16Word(float lo, float hi) {
  return FloatToBf16(lo) | static_cast<uint32_t>(FloatToBf16(hi)) << 16;
}

// vdpbf16ps's step on one lane, under DenormalsFlushed: the high bf16 of a and b, then the low.
inline float ScalarDotPair(float acc, uint32_t a, uint32_t b) {
  const auto hi = [](uint32_t w) { return std::bit_cast<float>(w & 0xFFFF0000u); };
  const auto lo = [](uint32_t w) { return std::bit_cast<float>(w << 16); };
  return std::fma(lo(a), lo(b), std::fma(hi(a), hi(b), acc));
}

// While alive, this thread's float operations treat denormal operands as zero and flush denormal
// results to zero (MXCSR DAZ and FTZ), restored on destruction.
class DenormalsFlushed {
 public:
  DenormalsFlushed();
  ~DenormalsFlushed();
  DenormalsFlushed(const DenormalsFlushed&) = delete;
  DenormalsFlushed& operator=(const DenormalsFlushed&) = delete;

 private:
  unsigned saved_;
};

}  // namespace duet::compute::cpu::internal
