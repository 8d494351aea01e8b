#include "absl/strings/str_cat.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cpu/cpu_backend.h"

namespace duet::compute {

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateBackend(const std::string& name,
                                                              const BackendOptions& options) {
  if (name == "cpu" || name == "auto") {
    auto backend = CpuBackend::Create(options);
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<ComputeBackend>(std::move(backend).value());
  }
  if (name == "cuda") {
    return absl::UnimplementedError(
        "compute backend 'cuda': the CUDA backend is not built yet (use 'cpu' or 'auto')");
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown compute backend '", name,
                                                 "': valid names are 'auto', 'cpu', 'cuda'"));
}

}  // namespace duet::compute
