// The quantized-weight GEMM (cpu/quant_gemm.h): bitwise equal to an independent scalar model of
// its stated arithmetic on every ISA path this CPU runs, within the activation-quantization
// bound of the float product, batch- and thread-invariant, and refusing what it cannot keep.
#include "common/compute/cpu/quant_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/base/float16.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/cpu/cpu_isa.h"
#include "gtest/gtest.h"
#include "tests/unit/compute/test_util.h"

namespace duet::compute {
namespace {

using cpu::CpuIsa;
using cpu::QuantFormat;
using testing::RandomVector;

constexpr QuantFormat kFormats[] = {QuantFormat::kQ8_0, QuantFormat::kQ4_0, QuantFormat::kQ4_1};

WeightFormat ToWeightFormat(QuantFormat f) {
  switch (f) {
    case QuantFormat::kQ8_0:
      return WeightFormat::kQ8_0;
    case QuantFormat::kQ4_0:
      return WeightFormat::kQ4_0;
    case QuantFormat::kQ4_1:
      return WeightFormat::kQ4_1;
  }
  return WeightFormat::kF32;
}

// Every path the host runs (scalar and avx2 at least on x86-64).
std::vector<CpuIsa> HostPaths() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Vnni,
                     CpuIsa::kAvx512Bf16}) {
    if (cpu::MissingFeature(isa, cpu::HostCpuFeatures()).empty()) out.push_back(isa);
  }
  return out;
}

// Random GGUF blocks: n rows of k / 32 blocks, every code value possible (Q8_0 includes -128).
std::vector<uint8_t> RandomBlocks(QuantFormat f, int n, int k, uint32_t seed) {
  std::mt19937 rng(seed);
  const int bb = cpu::QuantBlockBytes(f);
  std::vector<uint8_t> out(static_cast<size_t>(n) * (k / 32) * bb);
  std::uniform_real_distribution<float> scale(0.002f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  for (size_t b = 0; b < out.size() / bb; ++b) {
    uint8_t* p = out.data() + b * bb;
    const uint16_t d = FloatToHalf(scale(rng));
    std::memcpy(p, &d, 2);
    int first = 2;
    if (f == QuantFormat::kQ4_1) {
      const uint16_t m = FloatToHalf(-8.f * scale(rng));
      std::memcpy(p + 2, &m, 2);
      first = 4;
    }
    for (int i = first; i < bb; ++i) p[i] = static_cast<uint8_t>(byte(rng));
  }
  return out;
}

// Element e of GGUF block `p`: its integer code and dequantized value (ggml's formulas).
int Code(QuantFormat f, const uint8_t* p, int e) {
  if (f == QuantFormat::kQ8_0) return static_cast<int8_t>(p[2 + e]);
  const uint8_t* qs = p + (f == QuantFormat::kQ4_1 ? 4 : 2);
  return e < 16 ? (qs[e] & 15) : (qs[e - 16] >> 4);
}
float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}
float Dequant(QuantFormat f, const uint8_t* p, int e) {
  const int q = Code(f, p, e);
  if (f == QuantFormat::kQ8_0) return static_cast<float>(q) * Half(p);
  return static_cast<float>(q - (f == QuantFormat::kQ4_0 ? 8 : 0)) * Half(p) +
         (f == QuantFormat::kQ4_1 ? Half(p + 2) : 0.f);
}

// quant_gemm.h's arithmetic written out from the GGUF bytes (no packing, no tiles).
std::vector<float> ModelOfKernel(QuantFormat f, const std::vector<uint8_t>& w, int n, int k,
                                 const std::vector<float>& x, int m, const float* bias) {
  const int bb = cpu::QuantBlockBytes(f);
  const int blocks = k / 32;
  std::vector<float> y(static_cast<size_t>(m) * n);
  std::vector<int8_t> q(k);
  std::vector<float> d(blocks), dsum(blocks);
  std::vector<int32_t> sum(blocks);
  for (int i = 0; i < m; ++i) {
    cpu::QuantizeActivationRow(x.data() + static_cast<size_t>(i) * k, k, q.data(), d.data(),
                               sum.data(), dsum.data());
    for (int j = 0; j < n; ++j) {
      float acc = 0.f;
      for (int b = 0; b < blocks; ++b) {
        const uint8_t* p = w.data() + (static_cast<size_t>(j) * blocks + b) * bb;
        int32_t isum = 0;
        for (int e = 0; e < 32; ++e) {
          isum += (Code(f, p, e) - (f == QuantFormat::kQ4_0 ? 8 : 0)) * q[b * 32 + e];
        }
        acc = std::fma(Half(p) * d[b], static_cast<float>(isum), acc);
        if (f == QuantFormat::kQ4_1) acc = std::fma(Half(p + 2), dsum[b], acc);
      }
      y[static_cast<size_t>(i) * n + j] = bias != nullptr ? acc + bias[j] : acc;
    }
  }
  return y;
}

std::unique_ptr<CpuBackend> Backend(int threads, CpuIsa isa, const std::string& gemm = "") {
  auto b = CpuBackend::Create(
      {.num_threads = threads, .cpu_gemm = gemm, .cpu_isa = cpu::CpuIsaName(isa)});
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(b).value() : nullptr;
}

std::vector<float> MatMulStored(ComputeBackend& backend, QuantFormat f,
                                const std::vector<uint8_t>& w, int n, int k,
                                const std::vector<float>& x, int m, const float* bias) {
  auto pm = backend.PrepareStoredMatrix(
      {.format = ToWeightFormat(f), .data = w.data(), .rows = n, .cols = k});
  EXPECT_TRUE(pm.ok()) << pm.status();
  if (!pm.ok()) return {};
  EXPECT_EQ((*pm)->bytes(),
            static_cast<int64_t>((n + 15) / 16 * 16) * (k / 32) * cpu::QuantBlockBytes(f));
  std::vector<float> y(static_cast<size_t>(m) * n, -777.f);
  backend.MatMul(x.data(), m, **pm, bias, y.data());
  return y;
}

bool SameBits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Every path equals the written-out arithmetic bit for bit: odd n (a partial group), several
// M (partial row tiles), with and without bias.
TEST(QuantGemmTest, EveryPathEqualsTheStatedArithmeticBitwise) {
  for (QuantFormat f : kFormats) {
    for (auto [n, k, m] : {std::tuple{40, 96, 1}, std::tuple{16, 32, 5}, std::tuple{67, 160, 9},
                           std::tuple{128, 64, 33}}) {
      const auto w = RandomBlocks(f, n, k, 7 + n);
      const auto x = RandomVector(static_cast<size_t>(m) * k, 11 + m, -2.f, 2.f);
      const auto bias = RandomVector(n, 5);
      for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
        const std::vector<float> want = ModelOfKernel(f, w, n, k, x, m, b);
        for (CpuIsa isa : HostPaths()) {
          auto backend = Backend(2, isa);
          const std::vector<float> got = MatMulStored(*backend, f, w, n, k, x, m, b);
          ASSERT_EQ(got.size(), want.size());
          EXPECT_TRUE(SameBits(got.data(), want.data(), got.size()))
              << cpu::QuantFormatName(f) << " " << cpu::CpuIsaName(isa) << " n=" << n << " k=" << k
              << " m=" << m << " bias=" << (b != nullptr);
        }
      }
    }
  }
}

// Each activation code is the nearest step: |x - d q| <= d / 2 (to float rounding), |q| <= 127,
// the block's largest |x| maps to +-127, and sum / dsum are the codes' sum and d times it.
TEST(QuantGemmTest, ActivationCodesAreTheNearestStep) {
  const int k = 256;
  auto x = RandomVector(k, 31, -3.f, 3.f);
  x[40] = 0.f;
  for (int e = 64; e < 96; ++e) x[e] = 0.f;  // an all-zero block: d = 0, codes 0
  std::vector<int8_t> q(k);
  std::vector<float> d(k / 32), dsum(k / 32);
  std::vector<int32_t> sum(k / 32);
  cpu::QuantizeActivationRow(x.data(), k, q.data(), d.data(), sum.data(), dsum.data());
  for (int b = 0; b < k / 32; ++b) {
    int32_t s = 0;
    float amax = 0;
    for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(x[b * 32 + e]));
    EXPECT_EQ(d[b], amax / 127.f);
    for (int e = 0; e < 32; ++e) {
      const int i = b * 32 + e;
      EXPECT_LE(std::abs(q[i]), 127);
      EXPECT_LE(std::fabs(x[i] - d[b] * q[i]), 0.5f * d[b] * (1 + 1e-5f)) << "element " << i;
      if (std::fabs(x[i]) == amax && amax > 0) EXPECT_EQ(std::abs(q[i]), 127);
      s += q[i];
    }
    EXPECT_EQ(sum[b], s);
    EXPECT_EQ(dsum[b], d[b] * static_cast<float>(s));
  }
  EXPECT_EQ(d[2], 0.f);
}

// Against the float product of x and the dequantized weights (double precision): the error is
// at most what quantizing the activations costs, sum over k of |w_k| * d_x(block of k) / 2,
// plus float rounding (a few eps of sum |x_k w_k| per block).
TEST(QuantGemmTest, WithinTheActivationQuantizationBoundOfTheFloatProduct) {
  const int n = 48, k = 256, m = 6;
  for (QuantFormat f : kFormats) {
    const auto w = RandomBlocks(f, n, k, 3);
    auto x = RandomVector(static_cast<size_t>(m) * k, 4, -1.f, 1.f);
    x[5] = 40.f;  // an outlier coarsens its block only
    auto backend = Backend(1, CpuIsa::kScalar);
    const std::vector<float> y = MatMulStored(*backend, f, w, n, k, x, m, nullptr);
    const int bb = cpu::QuantBlockBytes(f);
    double worst = 0;
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double ref = 0, bound = 0, mag = 0;
        for (int b = 0; b < k / 32; ++b) {
          const uint8_t* p = w.data() + (static_cast<size_t>(j) * (k / 32) + b) * bb;
          double amax = 0;
          for (int e = 0; e < 32; ++e)
            amax = std::max(amax, std::fabs(double(x[i * k + b * 32 + e])));
          for (int e = 0; e < 32; ++e) {
            const double wv = Dequant(f, p, e), xv = x[i * k + b * 32 + e];
            ref += wv * xv;
            bound += std::fabs(wv) * 0.5 * amax / 127.0 * (1 + 1e-5);
            mag += std::fabs(wv) * (std::fabs(xv) + amax / 127.0);
          }
        }
        const double err = std::fabs(y[i * n + j] - ref);
        EXPECT_LE(err, bound + 1e-6 * (k / 32 + 4) * mag)
            << cpu::QuantFormatName(f) << " row " << i << " col " << j;
        worst = std::max(worst, err / std::max(bound, 1e-30));
      }
    }
    EXPECT_GT(worst, 0.0);  // the activations really are quantized
  }
}

// A row's result is bitwise the same alone (M = 1) and inside M = 7, 33, 64 at any position,
// for 1, 2 and 3 threads, on every path.
TEST(QuantGemmTest, RowsAreBatchAndThreadInvariant) {
  const int n = 200, k = 192;
  for (QuantFormat f : kFormats) {
    const auto w = RandomBlocks(f, n, k, 21);
    const auto bias = RandomVector(n, 22);
    const auto rows = RandomVector(static_cast<size_t>(64) * k, 23, -3.f, 3.f);
    for (CpuIsa isa : HostPaths()) {
      auto one_thread = Backend(1, isa);
      for (int threads : {1, 2, 3}) {
        auto backend = Backend(threads, isa);
        for (int m : {7, 33, 64}) {
          const std::vector<float> x(rows.begin(), rows.begin() + static_cast<size_t>(m) * k);
          const std::vector<float> batch = MatMulStored(*backend, f, w, n, k, x, m, bias.data());
          for (int r : {0, m / 2, m - 1}) {
            const std::vector<float> xr(x.begin() + static_cast<size_t>(r) * k,
                                        x.begin() + static_cast<size_t>(r + 1) * k);
            const std::vector<float> alone =
                MatMulStored(*one_thread, f, w, n, k, xr, 1, bias.data());
            EXPECT_TRUE(SameBits(alone.data(), batch.data() + static_cast<size_t>(r) * n, n))
                << cpu::QuantFormatName(f) << " " << cpu::CpuIsaName(isa) << " threads " << threads
                << " row " << r << " of " << m;
          }
        }
      }
    }
  }
}

// Realistic shapes through the backend: every path gives the scalar path's bits.
TEST(QuantGemmTest, IsaPathsAgreeWithScalarOnModelShapes) {
  const auto paths = HostPaths();
  if (paths.size() < 2) GTEST_SKIP() << "only the scalar path runs here";
  for (QuantFormat f : kFormats) {
    for (auto [n, k] : {std::pair{576, 1536}, std::pair{192, 576}}) {
      const auto w = RandomBlocks(f, n, k, n + k);
      const auto x = RandomVector(static_cast<size_t>(8) * k, 99, -4.f, 4.f);
      auto scalar = Backend(2, CpuIsa::kScalar);
      const std::vector<float> want = MatMulStored(*scalar, f, w, n, k, x, 8, nullptr);
      for (CpuIsa isa : paths) {
        auto backend = Backend(2, isa);
        EXPECT_TRUE(SameBits(MatMulStored(*backend, f, w, n, k, x, 8, nullptr).data(), want.data(),
                             want.size()))
            << cpu::QuantFormatName(f) << " " << cpu::CpuIsaName(isa) << " " << n << "x" << k;
      }
    }
  }
}

// A path this CPU lacks is refused by name (never replaced); a missing AVX-512 path is
// reported as such where the host has one (each path's own test runs only where it can).
// MatMuls (one pass over several matrices sharing x: q/k/v, gate/up) gives each product the
// bits MatMul gives it alone, for quantized, float32 and bf16 matrices and for a mix (which
// runs one by one), on every path, batch size and thread count.
TEST(QuantGemmTest, MatMulsEqualsMatMulPerProductBitwise) {
  const int k = 96;
  const int ns[] = {48, 16, 40};  // q, k, v-like: different widths, one k
  for (CpuIsa isa : HostPaths()) {
    for (int threads : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << cpu::CpuIsaName(isa) << " threads " << threads);
      auto backend = Backend(threads, isa);
      ASSERT_NE(backend, nullptr);
      std::vector<std::unique_ptr<PreparedMatrix>> quant, wide, mixed;
      std::vector<std::vector<float>> biases;
      for (int i = 0; i < 3; ++i) {
        const QuantFormat f = kFormats[i];
        const auto blocks = RandomBlocks(f, ns[i], k, 70 + i);
        auto q = backend->PrepareStoredMatrix(
            {.format = ToWeightFormat(f), .data = blocks.data(), .rows = ns[i], .cols = k});
        ASSERT_TRUE(q.ok()) << q.status();
        quant.push_back(*std::move(q));
        const auto w = RandomVector(static_cast<size_t>(ns[i]) * k, 80 + i);
        auto p = backend->PrepareMatrix(w.data(), ns[i], k);
        ASSERT_TRUE(p.ok()) << p.status();
        wide.push_back(*std::move(p));
        biases.push_back(RandomVector(ns[i], 90 + i));
      }
      for (int m : {1, 3, 8, 33, 70}) {
        const auto x = RandomVector(static_cast<size_t>(m) * k, 100 + m);
        for (const auto* set : {&quant, &wide}) {
          for (bool mix : {false, true}) {
            std::vector<const PreparedMatrix*> ws = {(*set)[0].get(), (*set)[1].get(),
                                                     (*set)[2].get()};
            if (mix) ws[1] = (set == &quant ? wide : quant)[1].get();
            std::vector<std::vector<float>> got(3), want(3);
            std::vector<MatMulProduct> products;
            for (int i = 0; i < 3; ++i) {
              got[i].assign(static_cast<size_t>(m) * ns[i], -1.f);
              want[i].assign(got[i].size(), -2.f);
              const float* bias = i == 1 ? nullptr : biases[i].data();
              backend->MatMul(x.data(), m, *ws[i], bias, want[i].data());
              products.push_back({ws[i], bias, got[i].data()});
            }
            backend->MatMuls(x.data(), m, products);
            for (int i = 0; i < 3; ++i) {
              ASSERT_EQ(std::memcmp(got[i].data(), want[i].data(), got[i].size() * 4), 0)
                  << "m " << m << " product " << i << (set == &quant ? " quant" : " f32")
                  << (mix ? " mixed" : "");
            }
          }
        }
      }
    }
  }
}

TEST(QuantGemmTest, PathsTheCpuLacksAreRefusedByName) {
  cpu::CpuFeatures avx2_only{.avx2 = true, .fma = true, .f16c = true};
  auto refused = cpu::ResolveCpuIsa("avx512_vnni", avx2_only);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("avx512f"), std::string::npos) << refused.status();
  cpu::CpuFeatures no_vnni = avx2_only;
  no_vnni.avx512f = no_vnni.avx512bw = no_vnni.avx512vl = true;
  refused = cpu::ResolveCpuIsa("avx512_vnni", no_vnni);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("avx512_vnni"), std::string::npos);
  EXPECT_EQ(*cpu::ResolveCpuIsa("auto", no_vnni), CpuIsa::kAvx512);
  EXPECT_EQ(*cpu::ResolveCpuIsa("auto", avx2_only), CpuIsa::kAvx2);
  EXPECT_EQ(*cpu::ResolveCpuIsa("auto", cpu::CpuFeatures{}), CpuIsa::kScalar);
  auto unknown = cpu::ResolveCpuIsa("sse9");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("sse9"), std::string::npos);
  for (const char* name : {"avx512", "avx512_vnni", "avx512_bf16"}) {
    auto b = CpuBackend::Create({.cpu_isa = name});
    if (!cpu::HostCpuFeatures().avx512f) {
      ASSERT_FALSE(b.ok()) << name;
      EXPECT_NE(b.status().message().find("lacks"), std::string::npos) << b.status();
    }
  }
}

TEST(QuantGemmTest, UnsupportedFormatsAndGemmsAreRefusedByName) {
  auto backend = Backend(1, CpuIsa::kScalar);
  const auto w = RandomBlocks(QuantFormat::kQ4_1, 16, 64, 1);
  auto odd = backend->PrepareStoredMatrix(
      {.format = WeightFormat::kQ4_1, .data = w.data(), .rows = 16, .cols = 48});
  EXPECT_FALSE(odd.ok());
  // The OpenBLAS GEMM takes f32 weights only (where this build has OpenBLAS).
  auto blas = CpuBackend::Create({.num_threads = 1, .cpu_gemm = "openblas"});
  if (blas.ok()) {
    auto b = (*blas)->PrepareStoredMatrix(
        {.format = WeightFormat::kQ4_1, .data = w.data(), .rows = 16, .cols = 64});
    ASSERT_FALSE(b.ok());
    EXPECT_NE(b.status().message().find("openblas"), std::string::npos) << b.status();
  }
}

// Embedding rows from a kept matrix are ggml's dequantized values (times the scale).
TEST(QuantGemmTest, EmbedFromMatrixIsTheDequantizedRow) {
  const int n = 37, k = 64;
  for (QuantFormat f : kFormats) {
    const auto w = RandomBlocks(f, n, k, 8);
    auto backend = Backend(2, HostPaths().back());
    auto pm = backend->PrepareStoredMatrix(
        {.format = ToWeightFormat(f), .data = w.data(), .rows = n, .cols = k});
    ASSERT_TRUE(pm.ok()) << pm.status();
    const std::vector<int32_t> ids = {36, 0, 17};
    std::vector<float> out(ids.size() * k);
    ASSERT_TRUE(backend->EmbedFromMatrix(**pm, ids.data(), 3, 2.5f, out.data()).ok());
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int e = 0; e < k; ++e) {
        const uint8_t* p =
            w.data() + (static_cast<size_t>(ids[i]) * (k / 32) + e / 32) * cpu::QuantBlockBytes(f);
        EXPECT_EQ(out[i * k + e], Dequant(f, p, e % 32) * 2.5f);
      }
    }
    const int32_t bad = n;
    EXPECT_FALSE(backend->EmbedFromMatrix(**pm, &bad, 1, 1.f, out.data()).ok());
  }
}

}  // namespace
}  // namespace duet::compute
