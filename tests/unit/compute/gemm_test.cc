#include "common/compute/cpu/gemm.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "common/base/float16.h"
#include "common/base/thread_pool.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cpu/cpu_isa.h"
#include "gtest/gtest.h"
#include "tests/unit/compute/test_util.h"

namespace duet::compute {
namespace {

using testing::HostCpuPaths;
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

void ExpectMatchesReference(CpuGemm gemm, int m, int n, int k, bool with_bias) {
  SCOPED_TRACE(::testing::Message() << CpuGemmName(gemm) << " m=" << m << " n=" << n << " k=" << k
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
      ExpectMatchesReference(CpuGemm::kInvariant, m, n, k, bias);
      ExpectMatchesReference(CpuGemm::kOpenBlas, m, n, k, bias);
    }
  }
}

TEST(GemmTest, KernelPerPath) {
  EXPECT_STREQ(cpu::GemmKernelName(cpu::CpuIsa::kScalar), "scalar");
  EXPECT_STREQ(cpu::GemmKernelName(cpu::CpuIsa::kAvx2), "avx2");
  EXPECT_STREQ(cpu::GemmKernelName(cpu::CpuIsa::kAvx512), "avx512");
  EXPECT_STREQ(cpu::GemmKernelName(cpu::CpuIsa::kAvx512Vnni), "avx512");
  EXPECT_STREQ(cpu::GemmKernelName(cpu::CpuIsa::kAvx512Bf16), "avx512_bf16");
  EXPECT_STREQ(cpu::GemmKernelName(cpu::CpuIsa::kAmx), "avx512_bf16");
}

// Every path equals the portable one (one thread, the reference) bit for bit over every M of
// 1..70 (each kernel's tile shapes and row remainders), N past whole panels, K past whole K
// blocks, with and without bias, on 1 and 2 threads.
TEST(GemmTest, EveryPathEqualsPortableBitwise) {
  const std::vector<std::pair<int, int>> nk = {{45, 401}, {17, 193}, {70, 385}, {1, 7}, {96, 64}};
  ThreadPool pool1(1), pool2(2);
  const std::vector<cpu::CpuIsa> paths = HostCpuPaths();
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
  for (cpu::CpuIsa isa : HostCpuPaths()) {
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

// 16-bit elements of a random [n, k] matrix in `type`, with f16 subnormals, signed zeros and
// the largest finite values mixed in.
std::vector<uint16_t> Random16(cpu::PanelType type, int n, int k, uint32_t seed) {
  const auto f = RandomVector(static_cast<size_t>(n) * k, seed, -3.f, 3.f);
  std::vector<uint16_t> bits(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    bits[i] = type == cpu::PanelType::kBf16 ? FloatToBf16(f[i]) : FloatToHalf(f[i]);
  }
  const uint16_t special[] = {0x0001, 0x8001, 0x03ff, 0x0000, 0x8000, 0x7bff, 0xfbff, 0x0400};
  for (size_t i = 0; i < bits.size(); i += 37) bits[i] = special[(i / 37) % 8];
  return bits;
}

std::vector<float> Widen(cpu::PanelType type, const std::vector<uint16_t>& bits) {
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    f[i] = type == cpu::PanelType::kBf16 ? Bf16ToFloat(bits[i]) : HalfToFloat(bits[i]);
  }
  return f;
}

// 16-bit panels on every path give the float32 portable GEMM's bits over the widened weights.
TEST(GemmTest, HalfPanelsEqualFloatGemmOnWidenedWeightsBitwise) {
  const std::vector<std::pair<int, int>> nk = {{45, 401}, {17, 193}, {96, 64}};
  ThreadPool pool(2);
  const std::vector<cpu::CpuIsa> paths = HostCpuPaths();
  int compared = 0;
  for (cpu::PanelType type : {cpu::PanelType::kBf16, cpu::PanelType::kF16}) {
    for (const auto& [n, k] : nk) {
      const auto bits = Random16(type, n, k, 41 + n);
      const auto wide = Widen(type, bits);
      const auto b = RandomVector(n, 42 + k);
      cpu::PackedWeights half = cpu::PackWeights16(bits.data(), n, k, type);
      cpu::PackedWeights full = cpu::PackWeights(wide.data(), n, k);
      ASSERT_TRUE(half.ok() && full.ok());
      EXPECT_EQ(half.bytes() * 2, full.bytes());
      std::vector<float> row(k);
      for (int r : {0, n / 2, n - 1}) {
        cpu::UnpackRow(half, r, row.data());
        EXPECT_EQ(std::memcmp(row.data(), wide.data() + static_cast<size_t>(r) * k,
                              k * sizeof(float)),
                  0)
            << cpu::PanelTypeName(type) << " row " << r;
      }
      for (int m : {1, 2, 3, 4, 5, 7, 8, 12, 13, 25, 64, 70}) {
        const auto x = RandomVector(static_cast<size_t>(m) * k, 43 + m);
        std::vector<float> want(static_cast<size_t>(m) * n);
        cpu::InvariantGemm(nullptr, x.data(), m, full, b.data(), want.data(),
                           cpu::CpuIsa::kScalar);
        for (cpu::CpuIsa isa : paths) {
          std::vector<float> got(want.size(), -12345.f);
          cpu::InvariantGemm(&pool, x.data(), m, half, b.data(), got.data(), isa);
          EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
              << cpu::PanelTypeName(type) << " " << cpu::CpuIsaName(isa) << " m=" << m
              << " n=" << n << " k=" << k;
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 2 * 3 * 12 * static_cast<int>(paths.size()));
}

// Panels keep the 16-bit elements as given, in the float32 layout; f32 is not a 16-bit type.
TEST(GemmTest, HalfPanelsKeepTheBitsInTheFloatLayout) {
  const int n = 20, k = 33;
  std::vector<uint16_t> bits(static_cast<size_t>(n) * k);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
  std::vector<float> as_float(bits.begin(), bits.end());  // exact: values < 2^24
  cpu::PackedWeights h = cpu::PackWeights16(bits.data(), n, k, cpu::PanelType::kF16);
  cpu::PackedWeights f = cpu::PackWeights(as_float.data(), n, k);
  ASSERT_TRUE(h.ok() && f.ok());
  EXPECT_EQ(h.type, cpu::PanelType::kF16);
  const int64_t elems = static_cast<int64_t>(h.num_panels) * k * cpu::kPanelCols;
  for (int64_t i = 0; i < elems; ++i) ASSERT_EQ(static_cast<float>(h.halfs[i]), f.data[i]) << i;
  EXPECT_FALSE(cpu::PackWeights16(bits.data(), n, k, cpu::PanelType::kF32).ok());
}

// The backend keeps stored bf16 / f16 matrices as they are: MatMul and EmbedFromMatrix give
// the float32 results over the widened weights; OpenBLAS refuses them by name.
TEST(GemmTest, BackendKeepsHalfMatrices) {
  auto backend = MakeCpuBackend(2);
  const int n = 37, k = 70, m = 9;
  for (auto [type, format] : {std::pair{cpu::PanelType::kBf16, WeightFormat::kBf16},
                              std::pair{cpu::PanelType::kF16, WeightFormat::kF16}}) {
    SCOPED_TRACE(cpu::PanelTypeName(type));
    const auto bits = Random16(type, n, k, 61);
    const auto wide = Widen(type, bits);
    ASSERT_TRUE(backend->KeepsWeightFormat(format));
    auto half = backend->PrepareStoredMatrix(
        {.format = format, .data = bits.data(), .rows = n, .cols = k});
    ASSERT_TRUE(half.ok()) << half.status();
    EXPECT_EQ((*half)->bytes(), int64_t{(n + 15) / 16 * 16} * k * 2);  // padded panels
    auto full = backend->PrepareMatrix(wide.data(), n, k);
    ASSERT_TRUE(full.ok());
    const auto x = RandomVector(static_cast<size_t>(m) * k, 62);
    std::vector<float> got(static_cast<size_t>(m) * n), want(got.size());
    backend->MatMul(x.data(), m, **half, nullptr, got.data());
    backend->MatMul(x.data(), m, **full, nullptr, want.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    const int32_t ids[] = {5, 0, 36};
    std::vector<float> rows(3 * k);
    ASSERT_TRUE(backend->EmbedFromMatrix(**half, ids, 3, 2.f, rows.data()).ok());
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < k; ++j) {
        ASSERT_EQ(rows[i * k + j], wide[static_cast<size_t>(ids[i]) * k + j] * 2.f);
      }
    }
    const int32_t bad[] = {n};
    EXPECT_FALSE(backend->EmbedFromMatrix(**half, bad, 1, 1.f, rows.data()).ok());
    auto blas = MakeCpuBackend(1, CpuGemm::kOpenBlas);
    if (blas != nullptr) {
      EXPECT_FALSE(blas->KeepsWeightFormat(format));
      auto r = blas->PrepareStoredMatrix(
          {.format = format, .data = bits.data(), .rows = n, .cols = k});
      ASSERT_FALSE(r.ok());
      EXPECT_NE(r.status().message().find(WeightFormatName(format)), std::string::npos)
          << r.status();
    }
  }
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
