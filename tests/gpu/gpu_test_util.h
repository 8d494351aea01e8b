// Helpers for the gpu-labelled tests: a CUDA backend or a GTEST_SKIP saying why there is none,
// device copies of host vectors, the normalised error used for tolerances, and how close a
// sampled row's draw comes to a boundary (where device and CPU sampling may differ).
//
//   auto cuda = MakeCudaBackendOrSkip("f32");
//   if (cuda == nullptr) return;  // skipped with a message
//   DeviceVec x(cuda.get(), host);
//   EXPECT_LT(RelErr(x.ToHost(), want), 1e-6);
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/compute/backend_registry.h"
#include "common/compute/cuda/cuda_backend.h"
#include "common/sampling/sampling.h"
#include "gtest/gtest.h"

namespace duet::compute::gpu_testing {

// Null (and the test marked skipped) when no CUDA device is usable. Call through
// DUET_CUDA_OR_SKIP so the skip returns from the test body.
inline std::unique_ptr<cuda::CudaBackend> MakeCudaBackend(const std::string& gemm_dtype,
                                                          std::string* why,
                                                          const std::string& prefill = "simt") {
  absl::StatusOr<int> count = cuda::CudaDeviceCount();
  if (!count.ok() || *count <= 0) {
    *why = "no usable GPU: " + (count.ok() ? std::string("0 CUDA devices")
                                            : std::string(count.status().message()));
    return nullptr;
  }
  BackendOptions options;
  options.cuda_gemm_dtype = ParseCudaGemmDtype(gemm_dtype).value();
  options.cuda_prefill_attention = ParseCudaPrefillAttention(prefill).value();
  auto backend = cuda::CudaBackend::Create(options);
  if (!backend.ok()) {
    ADD_FAILURE() << "a GPU is present but the CUDA backend failed: " << backend.status();
    *why = "backend creation failed";
    return nullptr;
  }
  return std::move(backend).value();
}

#define DUET_CUDA_OR_SKIP(var, dtype) DUET_CUDA_OR_SKIP_PREFILL(var, dtype, "simt")
#define DUET_CUDA_OR_SKIP_PREFILL(var, dtype, prefill)                                       \
  std::string var##_why;                                                                     \
  auto var = ::duet::compute::gpu_testing::MakeCudaBackend(dtype, &var##_why, prefill);     \
  if (var == nullptr) GTEST_SKIP() << var##_why

// Activation memory of a backend holding a copy of a host vector.
class DeviceVec {
 public:
  DeviceVec(ComputeBackend* b, const std::vector<float>& host) : b_(b), n_(host.size()) {
    p_ = b_->AllocateActivations(static_cast<int64_t>(std::max<size_t>(n_, 1)));
    b_->CopyToDevice(p_, host.data(), static_cast<int64_t>(n_));
  }
  DeviceVec(ComputeBackend* b, size_t n, float fill) : DeviceVec(b, std::vector<float>(n, fill)) {}
  ~DeviceVec() { b_->FreeActivations(p_); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  float* get() const { return p_; }
  std::vector<float> ToHost() const {
    std::vector<float> h(n_);
    b_->CopyToHost(h.data(), p_, static_cast<int64_t>(n_));
    return h;
  }

 private:
  ComputeBackend* b_;
  size_t n_;
  float* p_ = nullptr;
};

// ||a - b|| / ||b|| (infinite when a holds a NaN or the sizes differ).
inline double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// How close the CPU's decisions for one row come to a boundary (`logits` already processed,
// ProcessLogitsOnHost): the min-p cut's weights against min_p and the top-p cut's cumulative
// probability against top_p, and the draw against each kept cumulative weight (relative to
// the kept weight). Both infinite for greedy rows.
struct Margins {
  double top_p = INFINITY;
  double draw = INFINITY;
  // Within `tol` of a boundary: float rounding (sums in another order on the device) may pick
  // the neighbouring candidate.
  bool Near(double tol) const { return draw < tol || top_p < tol; }
};
// Relative distance below which device and CPU sampling may disagree.
inline constexpr double kSamplingBoundaryTol = 1e-9;

inline Margins SamplingMargins(const float* logits, int vocab, const RowSampling& p) {
  Margins m;
  if (p.temperature <= 0.f) return m;
  std::vector<int32_t> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  int n = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
  const double max_l = logits[idx[0]];
  std::vector<double> w(n);
  for (int i = 0; i < n; ++i) {
    w[i] = std::exp((logits[idx[i]] - max_l) / static_cast<double>(p.temperature));
  }
  if (p.min_p > 0.f) {  // the min-p cut: its weights against min_p count as a top-p margin
    for (int i = 1; i < n; ++i) {
      m.top_p = std::min(m.top_p, std::abs(w[i] - p.min_p));
      if (w[i] < p.min_p) {
        n = i;
        break;
      }
    }
  }
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += w[i];
  int keep = n;
  if (p.top_p < 1.f) {
    double acc = 0;
    for (int i = 0; i < n; ++i) {
      acc += w[i] / sum;
      m.top_p = std::min(m.top_p, std::abs(acc - p.top_p));
      if (acc >= p.top_p && keep == n) keep = i + 1;
    }
  }
  double kept = 0;
  for (int i = 0; i < keep; ++i) kept += w[i];
  const double u = SamplingUniform(p.seed, p.step) * kept;
  double acc = 0;
  for (int i = 0; i < keep; ++i) {
    acc += w[i];
    m.draw = std::min(m.draw, std::abs(acc - u) / kept);
  }
  return m;
}

}  // namespace duet::compute::gpu_testing
