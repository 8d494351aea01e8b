// Shared helpers for the compute tests: seeded random data, backend construction and the CPU
// paths this machine runs.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/compute/compute_backend.h"
#include "common/compute/cpu/cpu_isa.h"
#include "gtest/gtest.h"

namespace duet::compute::testing {

// Every CpuIsa path this CPU runs (the scalar one always).
inline std::vector<cpu::CpuIsa> HostCpuPaths() {
  std::vector<cpu::CpuIsa> paths;
  for (cpu::CpuIsa isa : cpu::kAllCpuIsas) {
    if (cpu::MissingFeature(isa, cpu::HostCpuFeatures()).empty()) paths.push_back(isa);
  }
  return paths;
}

inline std::vector<float> RandomVector(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::unique_ptr<ComputeBackend> MakeCpuBackend(int threads,
                                                      CpuGemm gemm = CpuGemm::kInvariant) {
  BackendOptions options;
  options.num_threads = threads;
  options.cpu_gemm = gemm;
  auto backend = CreateBackend(compute::Device::kCpu, options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(backend).value() : nullptr;
}

}  // namespace duet::compute::testing
