// RAII owners of CUDA runtime and cuBLAS handles: device buffers, pinned host buffers, host
// registrations, streams,
// events and cuBLAS handles. Each is move-only, created by a Create() that returns a Status
// naming the failed call, and releases its handle in a noexcept destructor.
//
//   DUET_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::Create(bytes));
//   DUET_ASSIGN_OR_RETURN(Stream stream, Stream::Create());
//   DUET_ASSIGN_OR_RETURN(Event done, Event::Create(/*timing=*/false));
//   DUET_CUDA_CHECK(cudaEventRecord(done.get(), stream.get()));
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"

namespace duet::compute::cuda {

namespace internal {
struct DeviceFree {
  void operator()(void* p) const noexcept;
};
struct HostFree {
  void operator()(void* p) const noexcept;
};
struct HostUnregister {
  void operator()(void* p) const noexcept;
};
struct StreamDestroy {
  void operator()(CUstream_st* s) const noexcept;
};
struct EventDestroy {
  void operator()(CUevent_st* e) const noexcept;
};
struct CublasDestroy {
  void operator()(cublasContext* h) const noexcept;
};
}  // namespace internal

// cudaMalloc'd device memory (never managed memory).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> Create(size_t bytes);
  void* get() const { return ptr_.get(); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_.get());
  }
  size_t bytes() const { return bytes_; }
  void reset() { ptr_.reset(); bytes_ = 0; }

 private:
  std::unique_ptr<void, internal::DeviceFree> ptr_;
  size_t bytes_ = 0;
};

// cudaMallocHost'd (page-locked) host memory, for asynchronous copies.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static absl::StatusOr<PinnedBuffer> Create(size_t bytes);
  void* get() const { return ptr_.get(); }
  size_t bytes() const { return bytes_; }

 private:
  std::unique_ptr<void, internal::HostFree> ptr_;
  size_t bytes_ = 0;
};

// Caller-owned host memory page-locked by cudaHostRegister until destroyed (cudaHostUnregister);
// must not outlive the memory.
class HostRegistration {
 public:
  HostRegistration() = default;
  static absl::StatusOr<HostRegistration> Create(void* p, size_t bytes);
  void* get() const { return ptr_.get(); }

 private:
  std::unique_ptr<void, internal::HostUnregister> ptr_;
};

class Stream {
 public:
  Stream() = default;
  // A non-blocking stream (does not synchronise with the legacy default stream).
  static absl::StatusOr<Stream> Create();
  cudaStream_t get() const { return s_.get(); }

 private:
  std::unique_ptr<CUstream_st, internal::StreamDestroy> s_;
};

class Event {
 public:
  Event() = default;
  // timing = false makes a lighter event for ordering only.
  static absl::StatusOr<Event> Create(bool timing);
  cudaEvent_t get() const { return e_.get(); }

 private:
  std::unique_ptr<CUevent_st, internal::EventDestroy> e_;
};

class CublasHandle {
 public:
  CublasHandle() = default;
  static absl::StatusOr<CublasHandle> Create();
  cublasHandle_t get() const { return h_.get(); }

 private:
  std::unique_ptr<cublasContext, internal::CublasDestroy> h_;
};

// Usable CUDA devices: cudaGetDeviceCount, with the error (no driver, no device) as a Status.
absl::StatusOr<int> CudaDeviceCount();

}  // namespace duet::compute::cuda
