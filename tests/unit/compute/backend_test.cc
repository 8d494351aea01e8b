#include <cstdint>
#include <cstring>
#include <vector>

#include "common/compute/compute_backend.h"
#include "common/compute/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/unit/compute/test_util.h"

namespace duet::compute {
namespace {

TEST(BackendFactoryTest, CpuAndAutoCreateCpuBackend) {
  for (const char* name : {"cpu", "auto"}) {
    auto backend = CreateBackend(name, BackendOptions{});
    ASSERT_TRUE(backend.ok()) << name << ": " << backend.status();
    EXPECT_EQ((*backend)->name(), "cpu");
  }
}

TEST(BackendFactoryTest, CudaIsUnimplemented) {
  auto backend = CreateBackend("cuda", BackendOptions{});
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(backend.status().message().find("not built"), absl::string_view::npos);
}

TEST(BackendFactoryTest, UnknownNameListsValidNames) {
  auto backend = CreateBackend("tpu", BackendOptions{});
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(backend.status().message().find("tpu"), absl::string_view::npos);
  EXPECT_NE(backend.status().message().find("cpu"), absl::string_view::npos);
}

TEST(BackendFactoryTest, BadOptionsRejected) {
  BackendOptions options;
  options.cpu_gemm = "mkl";
  auto backend = CreateBackend("cpu", options);
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(backend.status().message().find("mkl"), absl::string_view::npos);
  options.cpu_gemm = "invariant";
  options.num_threads = -1;
  EXPECT_EQ(CreateBackend("cpu", options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BackendFactoryTest, ThreadCountAndGemmKindFollowOptions) {
  auto backend = CpuBackend::Create({.num_threads = 3, .cpu_gemm = "openblas"});
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->num_threads(), 3);
  EXPECT_EQ((*backend)->gemm_kind(), CpuBackend::GemmKind::kOpenBlas);
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
