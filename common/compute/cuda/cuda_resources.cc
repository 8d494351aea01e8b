#include "common/compute/cuda/cuda_resources.h"

#include "absl/strings/str_cat.h"
#include "common/compute/cuda/cuda_check.h"

namespace duet::compute::cuda {
namespace internal {

void DeviceFree::operator()(void* p) const noexcept { cudaFree(p); }
void HostFree::operator()(void* p) const noexcept { cudaFreeHost(p); }
void HostUnregister::operator()(void* p) const noexcept { cudaHostUnregister(p); }
void StreamDestroy::operator()(CUstream_st* s) const noexcept { cudaStreamDestroy(s); }
void EventDestroy::operator()(CUevent_st* e) const noexcept { cudaEventDestroy(e); }
void CublasDestroy::operator()(cublasContext* h) const noexcept { cublasDestroy(h); }

}  // namespace internal

absl::StatusOr<DeviceBuffer> DeviceBuffer::Create(size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  void* p = nullptr;
  DUET_CUDA_CHECK(cudaMalloc(&p, bytes));
  b.ptr_.reset(p);
  b.bytes_ = bytes;
  return b;
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Create(size_t bytes) {
  PinnedBuffer b;
  if (bytes == 0) return b;
  void* p = nullptr;
  DUET_CUDA_CHECK(cudaMallocHost(&p, bytes));
  b.ptr_.reset(p);
  b.bytes_ = bytes;
  return b;
}

absl::StatusOr<HostRegistration> HostRegistration::Create(void* p, size_t bytes) {
  HostRegistration r;
  if (p == nullptr || bytes == 0) return r;
  DUET_CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterDefault));
  r.ptr_.reset(p);
  return r;
}

absl::StatusOr<Stream> Stream::Create() {
  Stream s;
  cudaStream_t raw = nullptr;
  DUET_CUDA_CHECK(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
  s.s_.reset(raw);
  return s;
}

absl::StatusOr<Event> Event::Create(bool timing) {
  Event e;
  cudaEvent_t raw = nullptr;
  DUET_CUDA_CHECK(cudaEventCreateWithFlags(&raw, timing ? cudaEventDefault : cudaEventDisableTiming));
  e.e_.reset(raw);
  return e;
}

absl::StatusOr<CublasHandle> CublasHandle::Create() {
  CublasHandle h;
  cublasHandle_t raw = nullptr;
  DUET_CUBLAS_CHECK(cublasCreate(&raw));
  h.h_.reset(raw);
  return h;
}

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;  // left untouched when there is no driver
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-less error so later calls start clean
    return absl::UnavailableError(absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorName(err), " (",
                                               static_cast<int>(err), "): ",
                                               cudaGetErrorString(err)));
  }
  return count;
}

}  // namespace duet::compute::cuda
