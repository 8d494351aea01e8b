// One checking macro per C API (CUDA runtime, cuBLAS): each turns a failed call into an
// absl::Status naming the call, the error and the call site (file:line).
//
//   absl::Status Upload(void* dst, const void* src, size_t n, cudaStream_t s) {
//     DUET_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s));
//     return absl::OkStatus();
//   }
//   absl::Status st = DUET_CUDA_STATUS(cudaGetLastError());  // no early return
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace duet::compute::cuda {

absl::Status CudaCallStatus(cudaError_t err, const char* expr, const char* file, int line);
absl::Status CublasCallStatus(cublasStatus_t err, const char* expr, const char* file, int line);

}  // namespace duet::compute::cuda

#define DUET_CUDA_STATUS(expr) \
  ::duet::compute::cuda::CudaCallStatus((expr), #expr, __FILE__, __LINE__)
#define DUET_CUBLAS_STATUS(expr) \
  ::duet::compute::cuda::CublasCallStatus((expr), #expr, __FILE__, __LINE__)

// Returns the status from the enclosing function when the CUDA call fails.
#define DUET_CUDA_CHECK(expr)                                  \
  do {                                                         \
    ::absl::Status duet_cuda_status_ = DUET_CUDA_STATUS(expr); \
    if (!duet_cuda_status_.ok()) return duet_cuda_status_;     \
  } while (false)

#define DUET_CUBLAS_CHECK(expr)                                  \
  do {                                                           \
    ::absl::Status duet_cublas_status_ = DUET_CUBLAS_STATUS(expr); \
    if (!duet_cublas_status_.ok()) return duet_cublas_status_;   \
  } while (false)
