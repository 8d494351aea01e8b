// Registry of optional compute backends. The CUDA backend (cuda/) registers itself from a
// static initializer in an object library that only binaries wanting CUDA link (CMake:
// duet_link_cuda_backend(target)), so CPU-only binaries never load cuBLAS. CreateBackend
// consults the registry (keyed by DeviceName) for every device but cpu.
//
//   RegisterBackendFactory("cuda", {.device_count = &CountDevices, .create = &MakeCuda});
//   absl::StatusOr<Device> picked = ResolveDevice(std::nullopt);  // auto: kCuda or kCpu
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/compute/compute_backend.h"

namespace duet::compute {

struct BackendFactory {
  // Usable devices, or an error saying why none is (e.g. "no CUDA driver (error 35)").
  std::function<absl::StatusOr<int>()> device_count;
  std::function<absl::StatusOr<std::unique_ptr<ComputeBackend>>(const BackendOptions&)> create;
};

// Registers (or replaces) the factory for `name`. Returns true so it can initialise a static.
bool RegisterBackendFactory(const std::string& name, BackendFactory factory);
// Removes the factory for `name` (tests).
void UnregisterBackendFactory(const std::string& name);
bool IsBackendRegistered(const std::string& name);

// Which backend CreateBackend(device) builds: cpu for cpu; for cuda, cuda or an error
// (Unimplemented when the backend is not linked into this binary, FailedPrecondition when no
// device is usable); for std::nullopt ("auto"), cuda when it is linked and a device is usable,
// else cpu. *why (optional) receives a one-line reason, logged by CreateBackend.
absl::StatusOr<Device> ResolveDevice(std::optional<Device> device, std::string* why = nullptr);

}  // namespace duet::compute
