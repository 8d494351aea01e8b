#include "common/compute/cuda/cuda_check.h"

#include "absl/strings/str_cat.h"

namespace duet::compute::cuda {

absl::Status CudaCallStatus(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  const auto code = err == cudaErrorMemoryAllocation ? absl::StatusCode::kResourceExhausted
                                                     : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(expr, " failed at ", file, ":", line, ": ",
                                         cudaGetErrorName(err), " (", static_cast<int>(err),
                                         "): ", cudaGetErrorString(err)));
}

absl::Status CublasCallStatus(cublasStatus_t err, const char* expr, const char* file, int line) {
  if (err == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const auto code = err == CUBLAS_STATUS_ALLOC_FAILED ? absl::StatusCode::kResourceExhausted
                                                      : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(expr, " failed at ", file, ":", line, ": ",
                                         cublasGetStatusName(err), " (", static_cast<int>(err),
                                         "): ", cublasGetStatusString(err)));
}

}  // namespace duet::compute::cuda
