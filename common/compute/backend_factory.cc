#include "absl/strings/str_cat.h"
#include "common/compute/compute_backend.h"

namespace duet::compute {

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateBackend(const std::string& name,
                                                              const BackendOptions& options) {
  return absl::UnimplementedError(absl::StrCat("compute backend '", name, "' not built"));
}

}  // namespace duet::compute
