// Linked as an object (CMake: duet_link_cuda_backend(target)) so its static initializer always
// runs: makes "cuda" (and "auto" on a GPU) available to compute::CreateBackend.
#include "common/compute/cuda/cuda_backend.h"

namespace {
[[maybe_unused]] const bool kCudaRegistered = duet::compute::cuda::RegisterCudaBackend();
}  // namespace
