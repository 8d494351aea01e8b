#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/uniform_hash.h"
#include "common/compute/backend_plugin.h"
#include "common/compute/backend_registry.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cpu/cpu_backend.h"

namespace duet::compute {
namespace {

std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}

std::map<std::string, BackendFactory>& Registry() {
  static auto* registry = new std::map<std::string, BackendFactory>();
  return *registry;
}

bool FindFactory(const std::string& name, BackendFactory* out) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find(name);
  if (it == Registry().end()) return false;
  *out = it->second;
  return true;
}

}  // namespace

bool RegisterBackendFactory(const std::string& name, BackendFactory factory) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry()[name] = std::move(factory);
  return true;
}

void UnregisterBackendFactory(const std::string& name) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry().erase(name);
}

bool IsBackendRegistered(const std::string& name) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  return Registry().count(name) > 0;
}

absl::StatusOr<Device> ResolveDevice(std::optional<Device> device, std::string* why) {
  std::string reason;
  auto done = [&](Device picked) -> absl::StatusOr<Device> {
    if (why != nullptr) *why = reason;
    return picked;
  };
  if (device == Device::kCpu) {
    reason = "requested";
    return done(Device::kCpu);
  }
  const bool cuda_asked = device == Device::kCuda;  // else auto
  const std::string cuda_name = DeviceName(Device::kCuda);
  BackendFactory cuda;
  if (!FindFactory(cuda_name, &cuda) && BackendPluginEnabled(cuda_name)) {
    // Built as a plugin: loaded for cuda always, for auto only where a GPU driver is.
    std::string absent;
    if (!cuda_asked && !GpuDeviceNodesPresent(&absent)) {
      reason = absl::StrCat("no usable GPU (", absent, "; the CUDA backend plugin was not loaded)");
      return done(Device::kCpu);
    }
    if (absl::Status loaded = LoadBackendPlugin(cuda_name); !loaded.ok()) {
      if (cuda_asked) return loaded;
      reason = absl::StrCat("the CUDA backend plugin did not load: ", loaded.message());
      return done(Device::kCpu);
    }
    FindFactory(cuda_name, &cuda);
  }
  if (!cuda.device_count && !cuda.create) {
    if (cuda_asked) {
      return absl::UnimplementedError(
          "compute backend 'cuda': the CUDA backend is not built into this binary (only "
          "binaries that link duet_cuda_backend or load its plugin have it, and only when nvcc "
          "was found at configure time; use 'cpu' or 'auto')");
    }
    reason = "the CUDA backend is not built into this binary";
    return done(Device::kCpu);
  }
  absl::StatusOr<int> devices = cuda.device_count ? cuda.device_count() : absl::StatusOr<int>(0);
  if (!devices.ok() || *devices <= 0) {
    const std::string detail =
        devices.ok() ? std::string("no CUDA device found") : std::string(devices.status().message());
    if (cuda_asked) {
      return absl::FailedPreconditionError(
          absl::StrCat("compute backend 'cuda' requested but no GPU is usable: ", detail));
    }
    reason = absl::StrCat("no usable GPU (", detail, ")");
    return done(Device::kCpu);
  }
  reason = absl::StrCat(*devices, " CUDA device(s) usable");
  return done(Device::kCuda);
}

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateBackend(std::optional<Device> device,
                                                              const BackendOptions& options) {
  std::string why;
  absl::StatusOr<Device> picked = ResolveDevice(device, &why);
  if (!picked.ok()) return picked.status();
  if (!device.has_value()) {
    DUET_LOG(INFO) << "compute backend: auto picked " << DeviceName(*picked) << " (" << why << ")";
  }
  if (*picked == Device::kCpu) {
    auto backend = CpuBackend::Create(options);
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<ComputeBackend>(std::move(backend).value());
  }
  BackendFactory factory;
  if (!FindFactory(DeviceName(*picked), &factory) || !factory.create) {
    return absl::InternalError(
        absl::StrCat("compute backend '", DeviceName(*picked), "' has no factory"));
  }
  return factory.create(options);
}

void FillUniformHost(float* out, int64_t count, uint64_t seed, float scale) {
  for (int64_t i = 0; i < count; ++i) out[i] = UniformFromHash(seed, static_cast<uint64_t>(i), scale);
}

void ComputeBackend::MatMuls(const float* x, int m, absl::Span<const MatMulProduct> products) {
  for (const MatMulProduct& p : products) MatMul(x, m, *p.w, p.bias, p.y);
}

absl::StatusOr<std::unique_ptr<PreparedMatrix>> ComputeBackend::PrepareRandomMatrix(
    int rows, int cols, uint64_t seed, float scale) {
  if (rows <= 0 || cols <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("PrepareRandomMatrix: bad shape ", rows, "x", cols));
  }
  std::vector<float> w(static_cast<size_t>(rows) * cols);
  FillUniformHost(w.data(), static_cast<int64_t>(w.size()), seed, scale);
  return PrepareMatrix(w.data(), rows, cols);
}

namespace {
class DoneMarker : public WorkMarker {
 public:
  bool Done() override { return true; }
  absl::Status Wait(absl::Time) override { return absl::OkStatus(); }
};
}  // namespace

absl::Status ComputeBackend::CheckKvDtype(kv::KvDtype dtype) const {
  if (kv::KvDtypeBytes(dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown KV dtype code ", static_cast<int>(dtype)));
  }
  return absl::OkStatus();
}

std::shared_ptr<WorkMarker> ComputeBackend::MarkQueuedWork() {
  static const auto done = std::make_shared<DoneMarker>();
  return done;
}

void ComputeBackend::FillRandom(float* p, int64_t count, uint64_t seed, float scale) {
  std::vector<float> host(static_cast<size_t>(count));
  FillUniformHost(host.data(), count, seed, scale);
  CopyToDevice(p, host.data(), count);
}

}  // namespace duet::compute

namespace duet::compute {

const char* WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return "f32";
    case WeightFormat::kBf16:
      return "bf16";
    case WeightFormat::kF16:
      return "f16";
    case WeightFormat::kQ8_0:
      return "Q8_0";
    case WeightFormat::kQ4_0:
      return "Q4_0";
    case WeightFormat::kQ4_1:
      return "Q4_1";
    case WeightFormat::kQ5_0:
      return "Q5_0";
    case WeightFormat::kQ5_1:
      return "Q5_1";
    case WeightFormat::kQ4_K:
      return "Q4_K";
    case WeightFormat::kQ5_K:
      return "Q5_K";
    case WeightFormat::kQ6_K:
      return "Q6_K";
    case WeightFormat::kQ2_K:
      return "Q2_K";
    case WeightFormat::kQ3_K:
      return "Q3_K";
  }
  return "?";
}

int64_t StoredMatrixBytes(WeightFormat format, int64_t rows, int64_t cols) {
  switch (format) {
    case WeightFormat::kF32:
      return rows * cols * 4;
    case WeightFormat::kBf16:
    case WeightFormat::kF16:
      return rows * cols * 2;
    case WeightFormat::kQ8_0:
      return rows * (cols / 32) * 34;
    case WeightFormat::kQ4_0:
      return rows * (cols / 32) * 18;
    case WeightFormat::kQ4_1:
      return rows * (cols / 32) * 20;
    case WeightFormat::kQ5_0:
      return rows * (cols / 32) * 22;
    case WeightFormat::kQ5_1:
      return rows * (cols / 32) * 24;
    case WeightFormat::kQ4_K:
      return rows * (cols / 256) * 144;
    case WeightFormat::kQ5_K:
      return rows * (cols / 256) * 176;
    case WeightFormat::kQ6_K:
      return rows * (cols / 256) * 210;
    case WeightFormat::kQ2_K:
      return rows * (cols / 256) * 84;
    case WeightFormat::kQ3_K:
      return rows * (cols / 256) * 110;
  }
  return 0;
}

absl::StatusOr<std::unique_ptr<PreparedMatrix>> ComputeBackend::PrepareStoredMatrix(
    const StoredMatrix& w) {
  if (w.format == WeightFormat::kF32) {
    return PrepareMatrix(static_cast<const float*>(w.data), w.rows, w.cols);
  }
  return absl::InvalidArgumentError(absl::StrCat("the ", name(), " backend cannot keep ",
                                                 WeightFormatName(w.format),
                                                 " weights (use --weights_dtype=f32)"));
}

absl::Status ComputeBackend::EmbedFromMatrix(const PreparedMatrix& table, const int32_t* ids, int n,
                                             float scale, float* out) {
  return absl::InvalidArgumentError(
      absl::StrCat("the ", name(), " backend has no embedding lookup from a prepared matrix"));
}

}  // namespace duet::compute
