#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "common/compute/compute_backend.h"
#include "common/compute/cpu/elementwise.h"
#include "common/compute/cpu/kv_codec.h"
#include "common/kv/kv_layout.h"
#include "gtest/gtest.h"
#include "tests/unit/compute/test_util.h"

namespace duet::compute {
namespace {

using testing::MakeCpuBackend;
using testing::RandomVector;

TEST(RmsNormTest, MatchesReferenceAndAliases) {
  auto backend = MakeCpuBackend(2);
  const int rows = 37, dim = 300;
  const float eps = 1e-5f;
  const auto x = RandomVector(static_cast<size_t>(rows) * dim, 1, -3.f, 3.f);
  const auto w = RandomVector(dim, 2, 0.5f, 1.5f);
  std::vector<float> y(x.size());
  backend->RmsNorm(x.data(), w.data(), rows, dim, eps, y.data());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int i = 0; i < dim; ++i) {
      const double want = x[r * dim + i] * inv * w[i];
      ASSERT_NEAR(y[r * dim + i], want, 1e-6 * (1 + std::abs(want))) << r << "," << i;
    }
  }
  std::vector<float> in_place = x;
  backend->RmsNorm(in_place.data(), w.data(), rows, dim, eps, in_place.data());
  EXPECT_EQ(in_place, y);
  // Row invariance: row 5 alone equals row 5 in the batch.
  std::vector<float> one(dim);
  MakeCpuBackend(1)->RmsNorm(x.data() + 5 * dim, w.data(), 1, dim, eps, one.data());
  EXPECT_EQ(std::memcmp(one.data(), y.data() + 5 * dim, dim * sizeof(float)), 0);
}

TEST(AddSwiGluTest, MatchReference) {
  auto backend = MakeCpuBackend(2);
  const int64_t n = 100003;  // several chunks plus a remainder
  const auto a = RandomVector(n, 3, -8.f, 8.f);
  const auto b = RandomVector(n, 4);
  std::vector<float> y = a;
  backend->Add(y.data(), b.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] + b[i]) << i;
  std::vector<float> out(n);
  backend->SwiGlu(a.data(), b.data(), n, out.data());
  for (int64_t i = 0; i < n; ++i) {
    const double g = a[i];
    const double want = g / (1.0 + std::exp(-g)) * b[i];
    ASSERT_NEAR(out[i], want, 1e-6 * (1 + std::abs(want))) << i;
  }
}

// Gemma's GeGLU: PyTorch's gelu(approximate="tanh") of the gate times up, in place too.
TEST(AddSwiGluTest, GeluTanhGluMatchesReferenceAndMayAlias) {
  auto backend = MakeCpuBackend(2);
  const int64_t n = 100003;
  const auto a = RandomVector(n, 5, -8.f, 8.f);
  const auto b = RandomVector(n, 6);
  std::vector<float> out(n);
  backend->GeluTanhGlu(a.data(), b.data(), n, out.data());
  for (int64_t i = 0; i < n; ++i) {
    const double x = a[i];
    const double gelu = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    const double want = gelu * b[i];
    ASSERT_NEAR(out[i], want, 1e-5 * (1 + std::abs(want))) << i << " x=" << x;
  }
  std::vector<float> g = a;
  backend->GeluTanhGlu(g.data(), b.data(), n, g.data());
  EXPECT_EQ(g, out);
}

// SwiGlu's eight-lane exp, over the range where the result is a normal float: relative error
// against double, in units of float's epsilon (2^-23); up = 1, so the output is silu itself.
TEST(AddSwiGluTest, SiluStaysWithinTwoUlpsAcrossTheRange) {
  auto backend = MakeCpuBackend(1);
  std::vector<float> x;
  for (float v = -80.f; v <= 80.f; v += 1.f / 512) x.push_back(v);
  const auto more = RandomVector(100000, 11, -12.f, 12.f);
  x.insert(x.end(), more.begin(), more.end());
  const int64_t n = static_cast<int64_t>(x.size());
  const std::vector<float> ones(n, 1.f);
  std::vector<float> silu(n);
  backend->SwiGlu(x.data(), ones.data(), n, silu.data());
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double want = v / (1.0 + std::exp(-v));
    if (std::abs(want) > 1e-30) worst = std::max(worst, std::abs(silu[i] - want) / std::abs(want));
  }
  EXPECT_LE(worst / std::ldexp(1.0, -23), 2) << "worst relative error in ulps";
}

// Gemma's GELU over the range where the result is a normal float, against double: within a few
// ulp beyond what rounding u = sqrt(2 / pi) (x + 0.044715 x^3) to float costs (d ln gelu / du =
// 2 sigma(-2u), so a relative error e in u moves the result by 2 sigma(-2u) |u| e). Where u < -9,
// 1 + tanh u in float has no digits left: such a GELU is off by millions of ulp there.
TEST(AddSwiGluTest, GeluStaysWithinAFewUlpsBeyondItsArgumentsRounding) {
  auto backend = MakeCpuBackend(1);
  std::vector<float> x;
  for (float v = -12.f; v <= 12.f; v += 1.f / 1024) x.push_back(v);
  const auto more = RandomVector(100000, 14, -10.f, 10.f);
  x.insert(x.end(), more.begin(), more.end());
  const int64_t n = static_cast<int64_t>(x.size());
  const std::vector<float> ones(n, 1.f);
  std::vector<float> gelu(n);
  backend->GeluTanhGlu(x.data(), ones.data(), n, gelu.data());
  const double eps = std::ldexp(1.0, -23);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double u = std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v);
    const double want = v / (1 + std::exp(-2 * u));
    if (std::abs(want) < 1e-30) continue;
    const double from_u = 2 / (1 + std::exp(2 * u)) * std::abs(u) * 4 * eps;  // u's roundings
    const double err = std::abs(gelu[i] - want) / std::abs(want);
    worst = std::max(worst, (err - from_u) / eps);
  }
  EXPECT_LE(worst, 3) << "worst relative error in ulps, beyond u's rounding";
}

// Each element's value is the same wherever it lies: alone, in a remainder, or mid-array; NaN
// stays NaN.
TEST(AddSwiGluTest, ActivationsDoNotDependOnPosition) {
  auto backend = MakeCpuBackend(2);
  const int64_t n = 5003;
  auto gate = RandomVector(n, 12, -9.f, 9.f);
  gate[17] = std::nanf("");
  const auto up = RandomVector(n, 13);
  for (bool gelu : {false, true}) {
    auto run = [&](const float* g, const float* u, int64_t m, float* out) {
      if (gelu) {
        backend->GeluTanhGlu(g, u, m, out);
      } else {
        backend->SwiGlu(g, u, m, out);
      }
    };
    std::vector<float> all(n);
    run(gate.data(), up.data(), n, all.data());
    EXPECT_TRUE(std::isnan(all[17])) << (gelu ? "gelu" : "silu");
    for (int64_t start : {0, 1, 5, 8, 999, 4996, 5002}) {
      for (int64_t len : {1, 3, 7, 8, 9}) {
        if (start + len > n) continue;
        std::vector<float> part(len);
        run(gate.data() + start, up.data() + start, len, part.data());
        EXPECT_EQ(std::memcmp(part.data(), all.data() + start, len * sizeof(float)), 0)
            << (gelu ? "gelu" : "silu") << " start " << start << " len " << len;
      }
    }
  }
}

TEST(AddSwiGluTest, SwiGluOutputMayAliasAnInput) {
  auto backend = MakeCpuBackend(2);
  const int64_t n = 4099;
  const auto gate = RandomVector(n, 9, -6.f, 6.f);
  const auto up = RandomVector(n, 10);
  std::vector<float> want(n);
  backend->SwiGlu(gate.data(), up.data(), n, want.data());
  std::vector<float> g = gate, u = up;
  backend->SwiGlu(g.data(), u.data(), n, g.data());
  EXPECT_EQ(g, want);
  g = gate;
  backend->SwiGlu(g.data(), u.data(), n, u.data());
  EXPECT_EQ(u, want);
}

TEST(RopeTest, MatchesRotateHalfReference) {
  auto backend = MakeCpuBackend(2);
  const int rows = 9, heads = 3, head_dim = 8, half = head_dim / 2;
  RopeParams rope;
  for (int i = 0; i < half; ++i) rope.inv_freq.push_back(std::pow(10000.f, -2.f * i / head_dim));
  const std::vector<int32_t> positions = {0, 1, 2, 7, 100, 511, 4095, 3, 30000};
  const auto x = RandomVector(static_cast<size_t>(rows) * heads * head_dim, 5);
  std::vector<float> y = x;
  backend->Rope(y.data(), rows, heads, head_dim, positions.data(), rope);
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      const float* xh = x.data() + (r * heads + h) * head_dim;
      const float* yh = y.data() + (r * heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const double angle = static_cast<double>(positions[r]) * rope.inv_freq[i];
        const double c = std::cos(angle), s = std::sin(angle);
        EXPECT_NEAR(yh[i], xh[i] * c - xh[i + half] * s, 1e-6) << r << "," << h << "," << i;
        EXPECT_NEAR(yh[i + half], xh[i + half] * c + xh[i] * s, 1e-6);
      }
    }
  }
  // Position 0 is the identity.
  for (int i = 0; i < heads * head_dim; ++i) EXPECT_EQ(y[i], x[i]);
}

// The backend keeps a call's angles for the next calls with the same positions and
// frequencies; every call must still rotate by its own positions and frequencies, bit for bit
// as RopeRows does.
TEST(RopeTest, KeptAnglesServeOnlyTheSamePositionsAndFrequencies) {
  auto backend = MakeCpuBackend(2);
  const int rows = 6, heads = 2, head_dim = 8, half = head_dim / 2;
  RopeParams f, g;
  for (int i = 0; i < half; ++i) {
    f.inv_freq.push_back(std::pow(10000.f, -2.f * i / head_dim));
    g.inv_freq.push_back(std::pow(1000000.f, -2.f * i / head_dim));
  }
  const std::vector<int32_t> a = {0, 1, 2, 3, 4, 5}, b = {6, 7, 8, 9, 10, 11},
                             c = {0, 1, 2, 3, 4, 6};
  const auto x = RandomVector(static_cast<size_t>(rows) * heads * head_dim, 8);
  int call = 0;
  // Hits, misses, a memo evicted and refilled, and a shorter batch of the same positions.
  for (auto [pos, rope, n] : {std::tuple{&a, &f, rows},
                              {&a, &f, rows},
                              {&b, &f, rows},
                              {&a, &g, rows},
                              {&c, &f, rows},
                              {&a, &f, 4},
                              {&b, &g, rows},
                              {&a, &f, rows},
                              {&b, &f, rows},
                              {&a, &g, rows}}) {
    std::vector<float> got = x, want = x;
    backend->Rope(got.data(), n, heads, head_dim, pos->data(), *rope);
    cpu::RopeRows(nullptr, want.data(), n, heads, head_dim, pos->data(), rope->inv_freq.data(),
                  half);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << "call " << call;
    ++call;
  }
}

TEST(EmbedTest, CopiesTableRows) {
  auto backend = MakeCpuBackend(2);
  const int vocab = 50, dim = 24;
  const auto table = RandomVector(static_cast<size_t>(vocab) * dim, 6);
  const std::vector<int32_t> ids = {3, 0, 49, 3, 17};
  std::vector<float> out(ids.size() * dim);
  backend->Embed(backend->UploadVector(table.data(), table.size()), dim, ids.data(),
                 static_cast<int>(ids.size()), out.data());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(std::memcmp(out.data() + i * dim, table.data() + ids[i] * dim, dim * sizeof(float)),
              0)
        << i;
  }
}

TEST(WriteKvTest, LandsInLayerBlockOffsetAndNowhereElse) {
  auto backend = MakeCpuBackend(1);
  kv::KvCacheView cache;
  cache.layout = {.model_id = "t",
                  .num_layers = 3,
                  .num_kv_heads = 2,
                  .head_dim = 4,
                  .block_size = 4,
                  .dtype = kv::KvDtype::kF32};
  cache.num_blocks = 6;
  std::vector<float> region(cache.layout.RegionBytes(cache.num_blocks) / sizeof(float), -1.f);
  cache.base = region.data();
  const int elems = 8;                                // kv_heads * head_dim
  const std::vector<int64_t> slots = {0, 5, 23, 13};  // (b0,o0) (b1,o1) (b5,o3) (b3,o1)
  const auto k = RandomVector(slots.size() * elems, 7);
  const auto v = RandomVector(slots.size() * elems, 8);
  const int layer = 2;
  backend->WriteKv(cache, layer, k.data(), v.data(), slots.data(), static_cast<int>(slots.size()));
  // Independent arithmetic: [layer][block][K|V][token][elems], floats.
  std::vector<float> want(region.size(), -1.f);
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t block = slots[i] / 4, offset = slots[i] % 4;
    const int64_t base = ((layer * 6 + block) * 2 * 4) * elems;
    for (int e = 0; e < elems; ++e) {
      want[base + offset * elems + e] = k[i * elems + e];
      want[base + (4 + offset) * elems + e] = v[i * elems + e];
    }
  }
  EXPECT_EQ(region, want);
}

// WriteKv stores each token's codes and scales (kv_codec.h) exactly where KvLayout's
// arithmetic puts them, and touches nothing else.
TEST(WriteKvTest, StoresCodesAndScalesWhereTheLayoutSays) {
  for (kv::KvDtype dtype : {kv::KvDtype::kF32, kv::KvDtype::kBF16, kv::KvDtype::kF16,
                            kv::KvDtype::kInt8, kv::KvDtype::kFp8E4M3}) {
    auto backend = MakeCpuBackend(1);
    kv::KvCacheView cache;
    cache.layout = {.model_id = "t",
                    .num_layers = 2,
                    .num_kv_heads = 2,
                    .head_dim = 8,
                    .block_size = 4,
                    .dtype = dtype};
    ASSERT_TRUE(cache.layout.Validate().ok());
    cache.num_blocks = 3;
    std::vector<uint8_t> region(cache.layout.RegionBytes(3), 0xab);
    cache.base = region.data();
    const auto k = RandomVector(2 * 16, 1), v = RandomVector(2 * 16, 2);
    const int64_t slots[2] = {2 * 4 + 1, 0 * 4 + 3};  // block 2 offset 1, block 0 offset 3
    backend->WriteKv(cache, 1, k.data(), v.data(), slots, 2);
    std::vector<uint8_t> want(region.size(), 0xab);
    const kv::KvCacheView expect{cache.layout, want.data(), 3};
    const size_t code_bytes = 16 * kv::KvDtypeBytes(dtype);
    for (int i = 0; i < 2; ++i) {
      const auto b = static_cast<kv::BlockId>(slots[i] / 4);
      const int off = static_cast<int>(slots[i] % 4);
      cpu::EncodeKvToken(dtype, k.data() + i * 16, 2, 8,
                         expect.KeyPtr<uint8_t>(1, b, 0) + off * code_bytes,
                         cache.layout.has_scales() ? expect.KeyScalePtr(1, b, off) : nullptr);
      cpu::EncodeKvToken(dtype, v.data() + i * 16, 2, 8,
                         expect.ValuePtr<uint8_t>(1, b, 0) + off * code_bytes,
                         cache.layout.has_scales() ? expect.ValueScalePtr(1, b, off) : nullptr);
    }
    EXPECT_EQ(region, want) << kv::KvDtypeName(dtype);
    // The scales sit inside the block's run: after its codes, before the next half.
    if (cache.layout.has_scales()) {
      EXPECT_EQ(reinterpret_cast<uint8_t*>(cache.KeyScalePtr(1, 2, 0)),
                cache.KeyPtr<uint8_t>(1, 2, 0) + cache.layout.HalfBlockDataBytes());
      EXPECT_EQ(reinterpret_cast<uint8_t*>(cache.KeyScalePtr(1, 2, 4)),
                cache.ValuePtr<uint8_t>(1, 2, 0));
      EXPECT_EQ(cache.layout.BlockBytes(), 2u * 4 * (16 * kv::KvDtypeBytes(dtype) + 2 * 4));
    }
  }
}

}  // namespace
}  // namespace duet::compute
