// The attention block kernels on AVX-512 F (compiled with -mavx512f and the AVX2 set; run only
// where the CPU has them, cpu_isa.h): the lanes of attention_avx512_isa.h, bf16 dot steps as two
// fmas each.
#include "common/compute/cpu/attention_avx512_isa.h"

namespace duet::compute::cpu::internal {

const AttentionKernels& AttentionKernelsAvx512() { return AttentionImpl<Avx512Isa>::Table(); }

}  // namespace duet::compute::cpu::internal
