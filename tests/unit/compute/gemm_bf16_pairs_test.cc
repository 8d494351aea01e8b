// The GEMM on bf16 dot products (gemm.h PanelType::kBf16Pairs, cpu_gemm "bf16"): every path
// gives the stated arithmetic bit for bit (x rounded to bf16 per row, one vdpbf16ps step per
// pair of k, denormals flushed), at every M, K block and thread count; the panels keep the
// bits; the backend packs bf16 matrices so under "bf16" and leaves f16 and f32 ones exact.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/base/float16.h"
#include "common/base/thread_pool.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cpu/bf16_dot.h"
#include "common/compute/cpu/cpu_isa.h"
#include "common/compute/cpu/gemm.h"
#include "gtest/gtest.h"
#include "tests/unit/compute/test_util.h"

namespace duet::compute {
namespace {

using testing::HostCpuPaths;
using testing::MakeCpuBackend;
using testing::RandomVector;

std::vector<uint16_t> RandomBf16(int n, int k, uint32_t seed) {
  const auto f = RandomVector(static_cast<size_t>(n) * k, seed, -3.f, 3.f);
  std::vector<uint16_t> bits(f.size());
  for (size_t i = 0; i < f.size(); ++i) bits[i] = FloatToBf16(f[i]);
  return bits;
}

// The arithmetic gemm.h states, element by element, written out here on its own: words of x
// rounded with FloatToBf16 and of w as stored, the pairs in order from 0, then + bias.
std::vector<float> Stated(const std::vector<float>& x, int m, const std::vector<uint16_t>& w, int n,
                          int k, const float* bias) {
  cpu::internal::DenormalsFlushed flushed;
  std::vector<float> y(static_cast<size_t>(m) * n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float acc = 0.f;
      for (int p = 0; 2 * p < k; ++p) {
        const float x0 = x[static_cast<size_t>(i) * k + 2 * p];
        const float x1 = 2 * p + 1 < k ? x[static_cast<size_t>(i) * k + 2 * p + 1] : 0.f;
        const uint16_t w0 = w[static_cast<size_t>(j) * k + 2 * p];
        const uint16_t w1 = 2 * p + 1 < k ? w[static_cast<size_t>(j) * k + 2 * p + 1] : 0;
        acc = cpu::internal::ScalarDotPair(acc, cpu::internal::Bf16Word(x0, x1),
                                           w0 | static_cast<uint32_t>(w1) << 16);
      }
      y[static_cast<size_t>(i) * n + j] = bias != nullptr ? acc + bias[j] : acc;
    }
  }
  return y;
}

// Every path, 1 and 2 threads, M from 1 to 100 (past kAllKRows, where K is cut in blocks of
// 192), odd K, with and without bias: the stated arithmetic's bits.
TEST(Bf16PairsGemmTest, EveryPathGivesTheStatedArithmeticBitwise) {
  const std::vector<std::pair<int, int>> nk = {{45, 401}, {17, 193}, {70, 385}, {1, 7},
                                               {96, 64},  {33, 1},   {20, 576}};
  ThreadPool pool1(1), pool2(2);
  const std::vector<cpu::CpuIsa> paths = HostCpuPaths();
  int compared = 0;
  for (const auto& [n, k] : nk) {
    const auto w = RandomBf16(n, k, 21 + n);
    const auto b = RandomVector(n, 22 + k);
    const cpu::PackedWeights packed = cpu::PackWeightsBf16Pairs(w.data(), n, k);
    ASSERT_TRUE(packed.ok());
    for (int m : {1, 2, 3, 4, 5, 7, 8, 9, 13, 25, 64, 65, 70, 100}) {
      const auto x = RandomVector(static_cast<size_t>(m) * k, 23 + m, -2.f, 2.f);
      for (const float* bias : {b.data(), static_cast<const float*>(nullptr)}) {
        const std::vector<float> want = Stated(x, m, w, n, k, bias);
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
  EXPECT_EQ(compared, 7 * 14 * 2 * 2 * static_cast<int>(paths.size()));
}

// Products and sums that fall into the denormal range are flushed, as vdpbf16ps flushes them,
// on every path; x rounds to bf16 by the integer rule, so a denormal x can round up to the
// smallest normal bf16 (and then counts).
TEST(Bf16PairsGemmTest, DenormalsAreFlushedOnEveryPath) {
  const int n = 16, k = 4, m = 3;
  std::vector<uint16_t> w(static_cast<size_t>(n) * k, FloatToBf16(std::ldexp(1.f, -70)));
  for (int j = 0; j < n; ++j) w[static_cast<size_t>(j) * k + 3] = FloatToBf16(1024.f);
  std::vector<float> x = {std::ldexp(1.f, -70),
                          std::ldexp(1.f, -70),
                          0.f,
                          0.f,  // row 0
                          0.f,
                          0.f,
                          0.f,
                          std::bit_cast<float>(0x007FFFFFu),  // row 1
                          0.f,
                          0.f,
                          0.f,
                          std::bit_cast<float>(0x00400000u)};  // row 2
  const cpu::PackedWeights packed = cpu::PackWeightsBf16Pairs(w.data(), n, k);
  ASSERT_TRUE(packed.ok());
  for (cpu::CpuIsa isa : HostCpuPaths()) {
    std::vector<float> y(static_cast<size_t>(m) * n, -1.f);
    cpu::InvariantGemm(nullptr, x.data(), m, packed, nullptr, y.data(), isa);
    for (int j = 0; j < n; ++j) {
      // 2^-140 twice: denormal products, flushed (unflushed the sum would be 2^-139).
      EXPECT_EQ(std::bit_cast<uint32_t>(y[j]), 0u) << cpu::CpuIsaName(isa);
      // The largest denormal float rounds to bf16 0x0080, the smallest normal: 2^-126 x 2^10.
      EXPECT_EQ(y[n + j], std::ldexp(1.f, -116)) << cpu::CpuIsaName(isa);
      // 2^-127 stays a denormal bf16 (0x0040), read as zero (unflushed: 2^-117, a normal).
      EXPECT_EQ(std::bit_cast<uint32_t>(y[2 * n + j]), 0u) << cpu::CpuIsaName(isa);
    }
  }
  // The caller's MXCSR is restored.
  volatile float tiny = std::numeric_limits<float>::min();
  EXPECT_GT(tiny / 2, 0.f);
}

// The panels hold the bf16 bits as given, two k to a word; UnpackRow widens them exactly; the
// size counts k rounded up to even.
TEST(Bf16PairsGemmTest, PanelsKeepTheBits) {
  const int n = 20, k = 33;
  const auto w = RandomBf16(n, k, 5);
  const cpu::PackedWeights p = cpu::PackWeightsBf16Pairs(w.data(), n, k);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p.type, cpu::PanelType::kBf16Pairs);
  EXPECT_EQ(p.bytes(), int64_t{2} * cpu::kPanelCols * 34 * 2);
  std::vector<float> row(k);
  for (int r = 0; r < n; ++r) {
    cpu::UnpackRow(p, r, row.data());
    for (int kk = 0; kk < k; ++kk) {
      ASSERT_EQ(std::bit_cast<uint32_t>(row[kk]),
                static_cast<uint32_t>(w[static_cast<size_t>(r) * k + kk]) << 16)
          << r << " " << kk;
    }
  }
  EXPECT_FALSE(cpu::PackWeights16(w.data(), n, k, cpu::PanelType::kBf16Pairs).ok());
}

// cpu_gemm "bf16": stored bf16 matrices on bf16 dot products (MatMul, a fused MatMuls pass and
// EmbedFromMatrix), f16 and f32 ones as exact as under "invariant"; x keeps only its top 16
// bits, so the result is near the exact GEMM's, not equal.
TEST(Bf16PairsGemmTest, BackendPacksBf16MatricesAsPairsUnderCpuGemmBf16) {
  auto dot = MakeCpuBackend(2, CpuGemm::kBf16);
  auto exact = MakeCpuBackend(2, CpuGemm::kInvariant);
  ASSERT_NE(dot, nullptr);
  const int n = 37, k = 70, m = 9;
  const auto bits = RandomBf16(n, k, 61);
  const auto x = RandomVector(static_cast<size_t>(m) * k, 62);
  const StoredMatrix stored{
      .format = WeightFormat::kBf16, .data = bits.data(), .rows = n, .cols = k};
  auto pairs = dot->PrepareStoredMatrix(stored);
  auto plain = exact->PrepareStoredMatrix(stored);
  ASSERT_TRUE(pairs.ok() && plain.ok());
  EXPECT_EQ((*pairs)->bytes(), int64_t{3} * cpu::kPanelCols * k * 2);
  std::vector<float> got(static_cast<size_t>(m) * n), want(got.size()), near(got.size());
  dot->MatMul(x.data(), m, **pairs, nullptr, got.data());
  const cpu::PackedWeights packed = cpu::PackWeightsBf16Pairs(bits.data(), n, k);
  cpu::InvariantGemm(nullptr, x.data(), m, packed, nullptr, want.data(), cpu::CpuIsa::kScalar);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  exact->MatMul(x.data(), m, **plain, nullptr, near.data());
  EXPECT_NE(std::memcmp(got.data(), near.data(), got.size() * sizeof(float)), 0);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], near[i], 0.05f * (1.f + std::fabs(near[i]))) << i;
  }
  // A fused pass with an f32 matrix of the same k: each product as alone.
  const auto wf = RandomVector(static_cast<size_t>(n) * k, 63);
  auto f32 = dot->PrepareMatrix(wf.data(), n, k);
  auto f32_exact = exact->PrepareMatrix(wf.data(), n, k);
  ASSERT_TRUE(f32.ok() && f32_exact.ok());
  std::vector<float> y0(got.size()), y1(got.size()), alone(got.size());
  const MatMulProduct products[] = {{pairs->get(), nullptr, y0.data()},
                                    {f32->get(), nullptr, y1.data()}};
  dot->MatMuls(x.data(), m, products);
  EXPECT_EQ(std::memcmp(y0.data(), got.data(), got.size() * sizeof(float)), 0);
  exact->MatMul(x.data(), m, **f32_exact, nullptr, alone.data());
  EXPECT_EQ(std::memcmp(y1.data(), alone.data(), got.size() * sizeof(float)), 0);
  // f16 stays exact: the float32 GEMM over the widened weights.
  std::vector<uint16_t> half(bits.size());
  std::vector<float> widened(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    half[i] = FloatToHalf(Bf16ToFloat(bits[i]));
    widened[i] = HalfToFloat(half[i]);
  }
  auto f16 = dot->PrepareStoredMatrix(
      {.format = WeightFormat::kF16, .data = half.data(), .rows = n, .cols = k});
  auto wide = exact->PrepareMatrix(widened.data(), n, k);
  ASSERT_TRUE(f16.ok() && wide.ok());
  dot->MatMul(x.data(), m, **f16, nullptr, y0.data());
  exact->MatMul(x.data(), m, **wide, nullptr, y1.data());
  EXPECT_EQ(std::memcmp(y0.data(), y1.data(), got.size() * sizeof(float)), 0);
  // The embedding rows come out as stored.
  const int32_t ids[] = {5, 0, 36};
  std::vector<float> rows(3 * k);
  ASSERT_TRUE(dot->EmbedFromMatrix(**pairs, ids, 3, 1.f, rows.data()).ok());
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < k; ++j) {
      ASSERT_EQ(rows[i * k + j], Bf16ToFloat(bits[static_cast<size_t>(ids[i]) * k + j]));
    }
  }
}

}  // namespace
}  // namespace duet::compute
