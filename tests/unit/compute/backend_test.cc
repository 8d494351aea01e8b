#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/base/auto_option.h"
#include "common/compute/backend_plugin.h"
#include "common/compute/backend_registry.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/unit/compute/test_util.h"

namespace duet::compute {
namespace {

TEST(BackendFactoryTest, CpuAndAutoCreateCpuBackend) {
  for (std::optional<Device> device :
       {std::optional<Device>(Device::kCpu), std::optional<Device>()}) {
    auto backend = CreateBackend(device, BackendOptions{});
    ASSERT_TRUE(backend.ok()) << NameOrAuto(device, DeviceName) << ": " << backend.status();
    EXPECT_EQ((*backend)->name(), "cpu");
  }
}

TEST(BackendFactoryTest, CudaIsUnimplemented) {
  auto backend = CreateBackend(Device::kCuda, BackendOptions{});
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(backend.status().message().find("not built"), absl::string_view::npos);
}

// A stand-in for the CUDA backend's registration (this binary does not link it): the registry
// logic behind --device=auto|cpu|cuda, testable without a GPU.
class FakeCudaRegistration {
 public:
  explicit FakeCudaRegistration(absl::StatusOr<int> devices) {
    RegisterBackendFactory(
        "cuda", {.device_count = [devices] { return devices; },
                 .create = [this](const BackendOptions& o)
                     -> absl::StatusOr<std::unique_ptr<ComputeBackend>> {
                   ++creates_;
                   auto b = CpuBackend::Create(o);
                   if (!b.ok()) return b.status();
                   return std::unique_ptr<ComputeBackend>(std::move(b).value());
                 }});
  }
  ~FakeCudaRegistration() { UnregisterBackendFactory("cuda"); }
  int creates() const { return creates_; }

 private:
  int creates_ = 0;
};

TEST(BackendFactoryTest, AutoPicksCudaWhenRegisteredAndADeviceIsUsable) {
  FakeCudaRegistration fake(2);
  std::string why;
  auto picked = ResolveDevice(std::nullopt, &why);
  ASSERT_TRUE(picked.ok()) << picked.status();
  EXPECT_EQ(*picked, Device::kCuda);
  EXPECT_NE(why.find("2 CUDA device"), std::string::npos) << why;
  ASSERT_TRUE(CreateBackend(std::nullopt, {}).ok());
  ASSERT_TRUE(CreateBackend(Device::kCuda, {}).ok());
  EXPECT_EQ(fake.creates(), 2);
  EXPECT_EQ(*ResolveDevice(Device::kCpu), Device::kCpu);
}

TEST(BackendFactoryTest, AutoFallsBackToCpuWithoutDevicesAndCudaIsAClearError) {
  for (absl::StatusOr<int> devices :
       {absl::StatusOr<int>(0), absl::StatusOr<int>(absl::UnavailableError("no driver (35)"))}) {
    FakeCudaRegistration fake(devices);
    std::string why;
    auto picked = ResolveDevice(std::nullopt, &why);
    ASSERT_TRUE(picked.ok()) << picked.status();
    EXPECT_EQ(*picked, Device::kCpu);
    EXPECT_NE(why.find("no usable GPU"), std::string::npos) << why;
    auto backend = CreateBackend(std::nullopt, {});
    ASSERT_TRUE(backend.ok()) << backend.status();
    EXPECT_EQ((*backend)->name(), "cpu");
    auto cuda = CreateBackend(Device::kCuda, {});
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
    if (!devices.ok()) {
      EXPECT_NE(cuda.status().message().find("no driver (35)"), absl::string_view::npos)
          << cuda.status();
    }
    EXPECT_EQ(fake.creates(), 0);
  }
  EXPECT_FALSE(IsBackendRegistered("cuda"));
}

TEST(BackendFactoryTest, AutoWithoutCudaBuiltPicksCpu) {
  ASSERT_FALSE(IsBackendRegistered("cuda")) << "this binary must not link the CUDA backend";
  std::string why;
  EXPECT_EQ(*ResolveDevice(std::nullopt, &why), Device::kCpu);
  EXPECT_NE(why.find("not built"), std::string::npos) << why;
}

// Plugins: a missing module is NotFound naming every place looked in; a file that is not a
// loadable module keeps dlopen's reason; both results are kept for the process.
TEST(BackendPluginTest, MissingAndBrokenModulesAreClearErrors) {
  const std::vector<std::string> candidates = BackendPluginCandidates("nosuch");
  ASSERT_GE(candidates.size(), 2u);
  EXPECT_NE(candidates[0].find("/libduet_nosuch_backend.so"), std::string::npos) << candidates[0];
  absl::Status missing = LoadBackendPlugin("nosuch");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  for (const std::string& c : candidates) {
    EXPECT_NE(missing.message().find(c), absl::string_view::npos) << missing << " lacks " << c;
  }
  EXPECT_EQ(LoadBackendPlugin("nosuch"), missing);

  const std::string broken = BackendPluginCandidates("broken")[0];  // beside this test binary
  { std::ofstream(broken) << "not an ELF module"; }
  absl::Status status = LoadBackendPlugin("broken");
  std::filesystem::remove(broken);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("does not load"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("libduet_broken_backend.so"), absl::string_view::npos) << status;
  EXPECT_FALSE(IsBackendRegistered("broken"));
}

// With the CUDA plugin enabled, "auto" on a machine without a GPU driver picks the cpu and says
// the plugin was not loaded (loading it would map cuBLAS for nothing).
TEST(BackendPluginTest, AutoLeavesTheCudaPluginUnloadedWithoutAGpuDriver) {
  if (GpuDeviceNodesPresent()) GTEST_SKIP() << "this machine has a GPU driver";
  ASSERT_FALSE(IsBackendRegistered("cuda"));
  EnableBackendPlugin("cuda");
  std::string why;
  absl::StatusOr<Device> picked = ResolveDevice(std::nullopt, &why);
  DisableBackendPlugin("cuda");
  ASSERT_TRUE(picked.ok()) << picked.status();
  EXPECT_EQ(*picked, Device::kCpu);
  EXPECT_NE(why.find("plugin was not loaded"), std::string::npos) << why;
  EXPECT_FALSE(IsBackendRegistered("cuda"));
}

// --device and --cpu_gemm: each enum's names parse back to it; anything else is refused naming
// the value and the valid names (with "auto" where the option takes it).
TEST(BackendOptionsTest, DeviceAndCpuGemmNamesRoundTripAndOthersAreRefused) {
  for (Device d : {Device::kCpu, Device::kCuda}) EXPECT_EQ(*ParseDevice(DeviceName(d)), d);
  EXPECT_STREQ(DeviceName(Device::kCuda), "cuda");
  for (CpuGemm g : {CpuGemm::kInvariant, CpuGemm::kBf16, CpuGemm::kOpenBlas}) {
    EXPECT_EQ(*ParseCpuGemm(CpuGemmName(g)), g);
  }
  EXPECT_STREQ(CpuGemmName(CpuGemm::kOpenBlas), "openblas");
  auto device = ParseOrAuto<Device>("tpu", ParseDevice);
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device.status().message(),
            "unknown compute backend 'tpu': valid names are cpu, cuda, or auto");
  EXPECT_EQ(*ParseOrAuto<Device>("auto", ParseDevice), std::nullopt);
  EXPECT_EQ(*ParseOrAuto<Device>("cuda", ParseDevice), Device::kCuda);
  EXPECT_EQ(NameOrAuto(std::optional<Device>(), DeviceName), "auto");
  auto gemm = ParseCpuGemm("mkl");
  EXPECT_EQ(gemm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gemm.status().message(),
            "unknown cpu_gemm 'mkl': valid values are invariant, bf16, openblas");
  EXPECT_FALSE(ParseCpuGemm("auto").ok());  // the GEMM has no auto
}

// The CUDA backend's GEMM dtype and prefill attention: the same, checked before any GPU is asked.
TEST(BackendOptionsTest, CudaGemmDtypeAndPrefillAttentionRoundTripAndOthersAreRefused) {
  for (CudaGemmDtype d : {CudaGemmDtype::kBf16, CudaGemmDtype::kF16, CudaGemmDtype::kF32}) {
    EXPECT_EQ(*ParseCudaGemmDtype(CudaGemmDtypeName(d)), d);
  }
  EXPECT_EQ(*ParseCudaGemmDtype("fp16"), CudaGemmDtype::kF16);
  EXPECT_EQ(*ParseCudaGemmDtype("fp32"), CudaGemmDtype::kF32);
  EXPECT_EQ(ParseCudaGemmDtype("int4").status().message(),
            "unknown cuda_gemm_dtype 'int4': valid values are bf16, f16, f32");
  for (CudaPrefillAttention a : {CudaPrefillAttention::kSimt, CudaPrefillAttention::kTensor}) {
    EXPECT_EQ(*ParseCudaPrefillAttention(CudaPrefillAttentionName(a)), a);
  }
  auto attn = ParseCudaPrefillAttention("flash");
  EXPECT_EQ(attn.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(attn.status().message(),
            "unknown cuda_prefill_attention 'flash': valid values are simt, tensor");
  const BackendOptions defaults;
  EXPECT_EQ(defaults.cuda_gemm_dtype, CudaGemmDtype::kBf16);
  EXPECT_EQ(defaults.cuda_prefill_attention, CudaPrefillAttention::kSimt);
}

TEST(BackendFactoryTest, BadOptionsRejected) {
  BackendOptions options;
  options.num_threads = -1;
  EXPECT_EQ(CreateBackend(compute::Device::kCpu, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BackendFactoryTest, ThreadCountAndGemmKindFollowOptions) {
  auto backend = CpuBackend::Create({.num_threads = 3, .cpu_gemm = CpuGemm::kOpenBlas});
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->num_threads(), 3);
  EXPECT_EQ((*backend)->gemm_kind(), CpuGemm::kOpenBlas);
}

TEST(CpuBackendTest, PrepareMatrixRejectsBadShapes) {
  auto backend = testing::MakeCpuBackend(1);
  std::vector<float> w(4, 1.f);
  EXPECT_EQ(backend->PrepareMatrix(w.data(), 0, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->PrepareMatrix(w.data(), 2, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->PrepareMatrix(nullptr, 2, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto ok = backend->PrepareMatrix(w.data(), 2, 2);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->rows(), 2);
  EXPECT_EQ((*ok)->cols(), 2);
}

TEST(CpuBackendTest, ActivationsAlignedAndCopiesRoundTrip) {
  auto backend = testing::MakeCpuBackend(2);
  const std::vector<float> host = testing::RandomVector(1001, 7);
  float* dev = backend->AllocateActivations(1001);
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(dev) % 64, 0u);
  backend->CopyToDevice(dev, host.data(), 1001);
  std::vector<float> back(1001, 0.f);
  backend->CopyToHost(back.data(), dev, 1001);
  EXPECT_EQ(back, host);
  backend->FreeActivations(dev);
  const float* up = backend->UploadVector(host.data(), 1001);
  EXPECT_EQ(std::memcmp(up, host.data(), 1001 * sizeof(float)), 0);
}

}  // namespace
}  // namespace duet::compute
