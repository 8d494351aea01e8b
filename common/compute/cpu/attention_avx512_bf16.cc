// The attention block kernels on AVX-512 with AVX512_BF16 (compiled with -mavx512bf16 as well;
// run only where the CPU has it, cpu_isa.h): attention_avx512_isa.h's lanes with the bf16 dot
// step done by vdpbf16ps itself.
#include "common/compute/cpu/attention_avx512_isa.h"

namespace duet::compute::cpu::internal {
namespace {

struct Avx512Bf16Isa : Avx512Isa {
  static V DotPair(V acc, W a, W b) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh&>(a), reinterpret_cast<__m512bh&>(b));
  }
  // vcvtne2ps2bf16: round to nearest even, NaN quieted, as RoundBf16; it also flushes denormal
  // inputs and outputs, which p (softmax weights: 0, or at least e^-86, a normal float) never
  // holds. The low 16 bf16 come from the second operand.
  static W PackPairs(const float* p) {
    const __m512bh h = _mm512_cvtne2ps_pbh(Load(p + 16), Load(p));
    return reinterpret_cast<const W&>(h);
  }
};

}  // namespace

const AttentionKernels& AttentionKernelsAvx512Bf16() {
  return AttentionImpl<Avx512Bf16Isa>::Table();
}

}  // namespace duet::compute::cpu::internal
