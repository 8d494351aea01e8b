#include "common/compute/cpu/gemm.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "common/base/thread_pool.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cpu/cpu_isa.h"
#include "gtest/gtest.h"
#include "tests/unit/compute/test_util.h"

namespace duet::compute {
namespace {

using testing::MakeCpuBackend;
using testing::RandomVector;

// Double-precision reference; also returns sum |x||w| + |b| per element for the tolerance.
void ReferenceGemm(const std::vector<float>& x, int m, const std::vector<float>& w, int n, int k,
                   const float* bias, std::vector<double>* y, std::vector<double>* mag) {
  y->assign(static_cast<size_t>(m) * n, 0.0);
  mag->assign(static_cast<size_t>(m) * n, 0.0);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = 0, a = 0;
      for (int kk = 0; kk < k; ++kk) {
        const double p = static_cast<double>(x[i * k + kk]) * w[static_cast<size_t>(j) * k + kk];
        acc += p;
        a += std::abs(p);
      }
      if (bias != nullptr) {
        acc += bias[j];
        a += std::abs(bias[j]);
      }
      (*y)[i * n + j] = acc;
      (*mag)[i * n + j] = a;
    }
  }
}

void ExpectMatchesReference(const std::string& gemm, int m, int n, int k, bool with_bias) {
  SCOPED_TRACE(::testing::Message() << gemm << " m=" << m << " n=" << n << " k=" << k
                                    << " bias=" << with_bias);
  auto backend = MakeCpuBackend(2, gemm);
  const auto x = RandomVector(static_cast<size_t>(m) * k, 1 + m);
  const auto w = RandomVector(static_cast<size_t>(n) * k, 2 + n);
  const auto b = RandomVector(n, 3 + k, -2.f, 2.f);
  const float* bias = with_bias ? b.data() : nullptr;
  auto pw = backend->PrepareMatrix(w.data(), n, k);
  ASSERT_TRUE(pw.ok()) << pw.status();
  std::vector<float> y(static_cast<size_t>(m) * n, -12345.f);
  backend->MatMul(x.data(), m, **pw, bias, y.data());
  std::vector<double> ref, mag;
  ReferenceGemm(x, m, w, n, k, bias, &ref, &mag);
  int bad = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double tol = 1.2e-7 * (k + 2) * mag[i] + 1e-30;  // ~2x the k*eps bound
    if (!(std::abs(y[i] - ref[i]) <= tol) && ++bad <= 5) {
      ADD_FAILURE() << "element " << i << ": got " << y[i] << " want " << ref[i];
    }
  }
}

TEST(GemmTest, OddShapesMatchDoubleReference) {
  const std::vector<std::tuple<int, int, int>> shapes = {
      {1, 1, 1},   {1, 16, 1},   {7, 1, 5},     {5, 17, 3},    {6, 32, 192}, {13, 33, 200},
      {37, 50, 193}, {2, 48, 385}, {100, 130, 64}, {97, 31, 577}, {3, 1, 1000}};
  for (const auto& [m, n, k] : shapes) {
    for (bool bias : {false, true}) {
      ExpectMatchesReference("invariant", m, n, k, bias);
      ExpectMatchesReference("openblas", m, n, k, bias);
    }
  }
}

// Every CpuIsa path this CPU runs (the scalar one always).
std::vector<cpu::CpuIsa> HostPaths() {
  std::vector<cpu::CpuIsa> paths;
  for (cpu::CpuIsa isa : {cpu::CpuIsa::kScalar, cpu::CpuIsa::kAvx2, cpu::CpuIsa::kAvx512,
                          cpu::CpuIsa::kAvx512Vnni, cpu::CpuIsa::kAvx512Bf16}) {
    if (cpu::MissingFeature(isa, cpu::HostCpuFeatures()).empty()) paths.push_back(isa);
  }
  return paths;
}

TEST(GemmTest, KernelPerPath) {
  EXPECT_STREQ(cpu::GemmKernelName(cpu::CpuIsa::kScalar), "scalar");
  EXPECT_STREQ(cpu::GemmKernelName(cpu::CpuIsa::kAvx2), "avx2");
  EXPECT_STREQ(cpu::GemmKernelName(cpu::CpuIsa::kAvx512), "avx512");
  EXPECT_STREQ(cpu::GemmKernelName(cpu::CpuIsa::kAvx512Vnni), "avx512");
  EXPECT_STREQ(cpu::GemmKernelName(cpu::CpuIsa::kAvx512Bf16), "avx512");
}

// Every path equals the portable one (one thread, the reference) bit for bit over every M of
// 1..70 (each kernel's tile shapes and row remainders), N past whole panels, K past whole K
// blocks, with and without bias, on 1 and 2 threads.
TEST(GemmTest, EveryPathEqualsPortableBitwise) {
  const std::vector<std::pair<int, int>> nk = {{45, 401}, {17, 193}, {70, 385}, {1, 7}, {96, 64}};
  ThreadPool pool1(1), pool2(2);
  const std::vector<cpu::CpuIsa> paths = HostPaths();
  int compared = 0;
  for (const auto& [n, k] : nk) {
    const auto w = RandomVector(static_cast<size_t>(n) * k, 11 + n);
    const auto b = RandomVector(n, 12 + k);
    cpu::PackedWeights packed = cpu::PackWeights(w.data(), n, k);
    ASSERT_NE(packed.data, nullptr);
    for (int m = 1; m <= 70; ++m) {
      const auto x = RandomVector(static_cast<size_t>(m) * k, 13 + m);
      for (const float* bias : {b.data(), static_cast<const float*>(nullptr)}) {
        std::vector<float> want(static_cast<size_t>(m) * n);
        cpu::InvariantGemm(nullptr, x.data(), m, packed, bias, want.data(), cpu::CpuIsa::kScalar);
        for (cpu::CpuIsa isa : paths) {
          for (ThreadPool* pool : {&pool1, &pool2}) {
            std::vector<float> got(want.size(), -12345.f);
            cpu::InvariantGemm(pool, x.data(), m, packed, bias, got.data(), isa);
            EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                << cpu::CpuIsaName(isa) << " m=" << m << " n=" << n << " k=" << k
                << " bias=" << (bias != nullptr) << " threads=" << pool->num_threads();
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, 5 * 70 * 2 * 2 * static_cast<int>(paths.size()));
}

// Per path: a row's bits do not depend on M, its position, its neighbours or the threads.
TEST(GemmTest, EveryPathIsBatchInvariant) {
  const int n = 50, k = 430;
  const auto w = RandomVector(static_cast<size_t>(n) * k, 31);
  const auto b = RandomVector(n, 32);
  const auto row = RandomVector(k, 33);
  cpu::PackedWeights packed = cpu::PackWeights(w.data(), n, k);
  ASSERT_NE(packed.data, nullptr);
  ThreadPool pool(2);
  for (cpu::CpuIsa isa : HostPaths()) {
    std::vector<float> alone(n);
    cpu::InvariantGemm(nullptr, row.data(), 1, packed, b.data(), alone.data(), isa);
    for (int m : {2, 3, 4, 5, 8, 11, 12, 13, 24, 25, 64, 97, 130}) {
      const auto others = RandomVector(static_cast<size_t>(m) * k, 200 + m);
      for (int pos : {0, m / 2, m - 1}) {
        std::vector<float> x = others;
        std::memcpy(x.data() + static_cast<size_t>(pos) * k, row.data(), k * sizeof(float));
        std::vector<float> y(static_cast<size_t>(m) * n);
        cpu::InvariantGemm(&pool, x.data(), m, packed, b.data(), y.data(), isa);
        EXPECT_EQ(
            std::memcmp(y.data() + static_cast<size_t>(pos) * n, alone.data(), n * sizeof(float)),
            0)
            << cpu::CpuIsaName(isa) << " m=" << m << " pos=" << pos;
      }
    }
  }
}

// A row's bits must not depend on M, its position, its neighbours or the thread count.
TEST(GemmTest, RowIsBitwiseBatchAndThreadInvariant) {
  const int n = 70, k = 400;  // partial last panel; K spans several K blocks
  const auto w = RandomVector(static_cast<size_t>(n) * k, 21);
  const auto b = RandomVector(n, 22);
  const auto row = RandomVector(k, 23);
  std::vector<std::unique_ptr<ComputeBackend>> backends;
  std::vector<std::unique_ptr<PreparedMatrix>> weights;
  for (int threads : {1, 2, 3}) {
    backends.push_back(MakeCpuBackend(threads));
    auto pw = backends.back()->PrepareMatrix(w.data(), n, k);
    ASSERT_TRUE(pw.ok());
    weights.push_back(std::move(pw).value());
  }
  std::vector<float> alone(n);
  backends[0]->MatMul(row.data(), 1, *weights[0], b.data(), alone.data());
  int cases = 0;
  for (int m : {1, 2, 3, 4, 5, 6, 7, 12, 13, 64, 97, 200, 301}) {
    const auto others = RandomVector(static_cast<size_t>(m) * k, 100 + m);
    for (int pos : {0, m / 2, m - 1}) {
      std::vector<float> x = others;
      std::memcpy(x.data() + static_cast<size_t>(pos) * k, row.data(), k * sizeof(float));
      for (size_t t = 0; t < backends.size(); ++t) {
        std::vector<float> y(static_cast<size_t>(m) * n);
        backends[t]->MatMul(x.data(), m, *weights[t], b.data(), y.data());
        EXPECT_EQ(std::memcmp(y.data() + static_cast<size_t>(pos) * n, alone.data(),
                              n * sizeof(float)),
                  0)
            << "m=" << m << " pos=" << pos << " threads=" << t + 1;
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 13 * 3 * 3);
}

TEST(GemmTest, BiasIsAddedOnceAfterTheSum) {
  auto backend = MakeCpuBackend(1);
  const std::vector<float> w = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};  // 2 x 3
  const std::vector<float> x = {1.f, 0.f, -1.f};
  const std::vector<float> b = {10.f, -20.f};
  auto pw = backend->PrepareMatrix(w.data(), 2, 3);
  ASSERT_TRUE(pw.ok());
  std::vector<float> y(2);
  backend->MatMul(x.data(), 1, **pw, b.data(), y.data());
  EXPECT_EQ(y[0], 1.f - 3.f + 10.f);
  EXPECT_EQ(y[1], 4.f - 6.f - 20.f);
  backend->MatMul(x.data(), 1, **pw, nullptr, y.data());
  EXPECT_EQ(y[0], -2.f);
  EXPECT_EQ(y[1], -2.f);
}

}  // namespace
}  // namespace duet::compute
