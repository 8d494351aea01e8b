// InvariantGemm's AVX-512 microkernel compiled with AVX512_BF16 as well (called only where the
// CPU has it, see cpu_isa.h): gemm_avx512_impl.h, with kBf16Pairs tiles on vdpbf16ps itself.
#include "common/compute/cpu/gemm_avx512_impl.h"

namespace duet::compute::cpu::internal {

const GemmKernel& Avx512Bf16GemmKernel() {
  static const GemmKernel kernel = MakeAvx512Kernel<true>("avx512_bf16");
  return kernel;
}

}  // namespace duet::compute::cpu::internal
