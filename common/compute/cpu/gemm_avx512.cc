// InvariantGemm's AVX-512 microkernel (compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512dq; called only where the CPU has them, see cpu_isa.h): gemm_avx512_impl.h, with
// kBf16Pairs tiles on vdpbf16ps's two fmas.
#include "common/compute/cpu/gemm_avx512_impl.h"

namespace duet::compute::cpu::internal {

const GemmKernel& Avx512GemmKernel() {
  static const GemmKernel kernel = MakeAvx512Kernel<false>("avx512");
  return kernel;
}

}  // namespace duet::compute::cpu::internal
