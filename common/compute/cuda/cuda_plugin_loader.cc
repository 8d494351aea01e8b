// Linked as an object (CMake: duet_use_cuda_plugin(target)) into binaries that load the CUDA
// backend on demand from libduet_cuda_backend.so instead of linking it: ResolveDevice then
// loads the plugin for "cuda", and for "auto" where a GPU driver is present (backend_plugin.h).
#include "common/compute/backend_plugin.h"

namespace {
[[maybe_unused]] const bool kCudaPluginEnabled = duet::compute::EnableBackendPlugin("cuda");
}  // namespace
