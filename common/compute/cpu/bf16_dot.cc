#include "common/compute/cpu/bf16_dot.h"

#include <immintrin.h>

namespace duet::compute::cpu::internal {

DenormalsFlushed::DenormalsFlushed() : saved_(_mm_getcsr()) {
  _mm_setcsr(saved_ | 0x8040u);  // FTZ (bit 15) | DAZ (bit 6)
}

DenormalsFlushed::~DenormalsFlushed() { _mm_setcsr(saved_); }

}  // namespace duet::compute::cpu::internal
