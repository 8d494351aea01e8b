// Shared helpers for the compute tests: seeded random data and backend construction.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/compute/compute_backend.h"
#include "gtest/gtest.h"

namespace duet::compute::testing {

inline std::vector<float> RandomVector(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::unique_ptr<ComputeBackend> MakeCpuBackend(int threads,
                                                      const std::string& gemm = "invariant") {
  BackendOptions options;
  options.num_threads = threads;
  options.cpu_gemm = gemm;
  auto backend = CreateBackend("cpu", options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(backend).value() : nullptr;
}

}  // namespace duet::compute::testing
