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

#include "common/base/auto_option.h"
#include "common/base/float16.h"
#include "common/base/ggml_blocks.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/cpu/cpu_isa.h"
#include "gtest/gtest.h"
#include "tests/unit/compute/test_util.h"

namespace duet::compute {
namespace {

using cpu::CpuIsa;
using cpu::QuantFormat;
using testing::HostCpuPaths;
using testing::RandomVector;

constexpr QuantFormat kFormats[] = {QuantFormat::kQ8_0, QuantFormat::kQ4_0, QuantFormat::kQ4_1,
                                    QuantFormat::kQ5_0, QuantFormat::kQ5_1, QuantFormat::kQ4_K,
                                    QuantFormat::kQ5_K, QuantFormat::kQ6_K, QuantFormat::kQ2_K,
                                    QuantFormat::kQ3_K};
// The K-quants with a min per sub-block.
bool KWithMin(QuantFormat f) { return f == QuantFormat::kQ4_K || f == QuantFormat::kQ5_K; }

bool WithMin(QuantFormat f) { return f == QuantFormat::kQ4_1 || f == QuantFormat::kQ5_1; }
bool FiveBit(QuantFormat f) { return f == QuantFormat::kQ5_0 || f == QuantFormat::kQ5_1; }
// o in x = (code - o) * d (+ m).
int Offset(QuantFormat f) { return f == QuantFormat::kQ4_0 ? 8 : f == QuantFormat::kQ5_0 ? 16 : 0; }

WeightFormat ToWeightFormat(QuantFormat f) {
  switch (f) {
    case QuantFormat::kQ8_0:
      return WeightFormat::kQ8_0;
    case QuantFormat::kQ4_0:
      return WeightFormat::kQ4_0;
    case QuantFormat::kQ4_1:
      return WeightFormat::kQ4_1;
    case QuantFormat::kQ5_0:
      return WeightFormat::kQ5_0;
    case QuantFormat::kQ5_1:
      return WeightFormat::kQ5_1;
    case QuantFormat::kQ4_K:
      return WeightFormat::kQ4_K;
    case QuantFormat::kQ5_K:
      return WeightFormat::kQ5_K;
    case QuantFormat::kQ6_K:
      return WeightFormat::kQ6_K;
    case QuantFormat::kQ2_K:
      return WeightFormat::kQ2_K;
    case QuantFormat::kQ3_K:
      return WeightFormat::kQ3_K;
  }
  return WeightFormat::kF32;
}

// k rounded up to whole blocks of the format (256 for the K-quants), and a row's GGUF bytes.
int Cols(QuantFormat f, int k) {
  const int e = cpu::QuantBlockElements(f);
  return (k + e - 1) / e * e;
}
size_t RowBytes(QuantFormat f, int k) {
  return static_cast<size_t>(k / cpu::QuantBlockElements(f)) * cpu::QuantBlockBytes(f);
}
// The bytes of a GGUF block that hold codes and integer scales, [first, last): all but its
// half d (and m / dmin).
std::pair<int, int> PayloadBytes(QuantFormat f) {
  if (KWithMin(f)) return {4, cpu::QuantBlockBytes(f)};
  if (f == QuantFormat::kQ6_K) return {0, 208};
  if (f == QuantFormat::kQ2_K) return {0, 80};
  if (f == QuantFormat::kQ3_K) return {0, 108};
  return {WithMin(f) ? 4 : 2, cpu::QuantBlockBytes(f)};
}

// Random GGUF blocks: n rows of k / QuantBlockElements blocks, every code and integer scale
// value possible (Q8_0 includes -128), halves in a plausible range.
std::vector<uint8_t> RandomBlocks(QuantFormat f, int n, int k, uint32_t seed) {
  std::mt19937 rng(seed);
  const int bb = cpu::QuantBlockBytes(f);
  std::vector<uint8_t> out(static_cast<size_t>(n) * RowBytes(f, k));
  std::uniform_real_distribution<float> scale(0.002f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  auto put = [&](uint8_t* p, float v) {
    const uint16_t h = FloatToHalf(v);
    std::memcpy(p, &h, 2);
  };
  for (size_t b = 0; b < out.size() / bb; ++b) {
    uint8_t* p = out.data() + b * bb;
    const auto [first, last] = PayloadBytes(f);
    for (int i = first; i < last; ++i) p[i] = static_cast<uint8_t>(byte(rng));
    if (KWithMin(f)) {
      put(p, scale(rng) / 8), put(p + 2, scale(rng) / 8);  // sc, m up to 63
    } else if (f == QuantFormat::kQ6_K) {
      put(p + 208, scale(rng) / 32);  // int8 scales
    } else if (f == QuantFormat::kQ2_K) {
      put(p + 80, scale(rng) / 2), put(p + 82, scale(rng) / 2);  // sc, m up to 15
    } else if (f == QuantFormat::kQ3_K) {
      put(p + 108, scale(rng) / 8);  // scales -32..31
    } else {
      put(p, scale(rng));
      if (WithMin(f)) put(p + 2, (FiveBit(f) ? -16.f : -8.f) * scale(rng));
    }
  }
  return out;
}

float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}

// Block b (of 32 elements) of row j as ggml defines it (ggml_blocks.h for the K-quants, checked
// against ggml's own output by gguf_kquant_test): v = code - offset, and
// x[e] = v[e] * dw[e / 16] + m (Q8_0: v * dw; Q4_K / Q5_K: m = -(dmin * min); Q6_K, Q3_K:
// m = 0; Q2_K: m of the half, and the integers it comes from).
struct Block32 {
  int v[32];
  float dw[2];
  float m = 0.f;
  float mh[2] = {0.f, 0.f};  // Q2_K: -(dmin * min) of each half
  int sc[2] = {0, 0}, min[2] = {0, 0};
  float d = 0.f, dmin = 0.f;
};
Block32 ReadBlock(QuantFormat f, const std::vector<uint8_t>& w, int k, int j, int b) {
  const uint8_t* row = w.data() + static_cast<size_t>(j) * RowBytes(f, k);
  Block32 out;
  if (KWithMin(f)) {
    KQuant4 q;
    const uint8_t* block = row + (b / 8) * cpu::QuantBlockBytes(f);
    f == QuantFormat::kQ4_K ? DecodeQ4K(block, &q) : DecodeQ5K(block, &q);
    for (int e = 0; e < 32; ++e) out.v[e] = q.codes[32 * (b % 8) + e];
    out.dw[0] = out.dw[1] = HalfToFloat(q.d) * static_cast<float>(q.scale[b % 8]);
    out.m = -(HalfToFloat(q.dmin) * static_cast<float>(q.min[b % 8]));
    return out;
  }
  if (f == QuantFormat::kQ2_K) {
    KQuant2 q;
    DecodeQ2K(row + (b / 8) * 84, &q);
    for (int e = 0; e < 32; ++e) out.v[e] = q.codes[32 * (b % 8) + e];
    out.d = HalfToFloat(q.d), out.dmin = HalfToFloat(q.dmin);
    for (int h = 0; h < 2; ++h) {
      out.sc[h] = q.scale[2 * (b % 8) + h], out.min[h] = q.min[2 * (b % 8) + h];
      out.dw[h] = out.d * static_cast<float>(out.sc[h]);
      out.mh[h] = -(out.dmin * static_cast<float>(out.min[h]));
    }
    return out;
  }
  if (f == QuantFormat::kQ6_K || f == QuantFormat::kQ3_K) {
    KQuant6 q;
    const uint8_t* block = row + (b / 8) * cpu::QuantBlockBytes(f);
    f == QuantFormat::kQ6_K ? DecodeQ6K(block, &q) : DecodeQ3KAsQ6K(block, &q);
    for (int e = 0; e < 32; ++e) out.v[e] = q.codes[32 * (b % 8) + e] - 32;
    for (int h = 0; h < 2; ++h) {
      out.dw[h] = HalfToFloat(q.d) * static_cast<float>(q.scale[2 * (b % 8) + h]);
    }
    return out;
  }
  const uint8_t* p = row + static_cast<size_t>(b) * cpu::QuantBlockBytes(f);
  const uint8_t* qs = p + (WithMin(f) ? 4 : 2);
  uint32_t qh = 0;
  if (FiveBit(f)) {  // d, (m,) 32 fifth bits (bit e for element e), then the nibbles as Q4_x
    std::memcpy(&qh, qs, 4);
    qs += 4;
  }
  for (int e = 0; e < 32; ++e) {
    const int high = static_cast<int>((qh >> e) & 1) << 4;
    const int code = f == QuantFormat::kQ8_0 ? static_cast<int8_t>(p[2 + e])
                                             : (e < 16 ? (qs[e] & 15) : (qs[e - 16] >> 4)) | high;
    out.v[e] = code - Offset(f);
  }
  out.dw[0] = out.dw[1] = Half(p);
  if (WithMin(f)) out.m = Half(p + 2);
  return out;
}
// Element e of a block, dequantized in ggml's order of operations.
float Dequant(QuantFormat f, const Block32& blk, int e) {
  const float v = static_cast<float>(blk.v[e]);
  if (f == QuantFormat::kQ8_0) return v * blk.dw[0];
  if (KWithMin(f)) return blk.dw[0] * v + blk.m;  // (d * sc) q - dmin m
  if (f == QuantFormat::kQ2_K) return blk.dw[e / 16] * v + blk.mh[e / 16];
  return v * blk.dw[e / 16] + blk.m;
}

// quant_gemm.h's arithmetic written out from the GGUF bytes (no packing, no tiles).
std::vector<float> ModelOfKernel(QuantFormat f, const std::vector<uint8_t>& w, int n, int k,
                                 const std::vector<float>& x, int m, const float* bias) {
  const int blocks = k / 32;
  std::vector<float> y(static_cast<size_t>(m) * n);
  std::vector<int8_t> q(k);
  std::vector<float> d(blocks), dsum(blocks);
  std::vector<int32_t> sum(blocks), sum_lo(blocks);
  for (int i = 0; i < m; ++i) {
    cpu::QuantizeActivationRow(x.data() + static_cast<size_t>(i) * k, k, q.data(), d.data(),
                               sum.data(), sum_lo.data(), dsum.data());
    for (int j = 0; j < n; ++j) {
      float acc = 0.f;
      for (int b = 0; b < blocks; ++b) {
        const Block32 blk = ReadBlock(f, w, k, j, b);
        int32_t isum[2] = {0, 0};
        for (int e = 0; e < 32; ++e) isum[e / 16] += blk.v[e] * q[b * 32 + e];
        if (f == QuantFormat::kQ2_K) {
          const int32_t lo = sum_lo[b], hi = sum[b] - sum_lo[b];
          acc = std::fma(blk.d * d[b],
                         static_cast<float>(blk.sc[0] * isum[0] + blk.sc[1] * isum[1]), acc);
          acc = std::fma(-(blk.dmin * d[b]), static_cast<float>(blk.min[0] * lo + blk.min[1] * hi),
                         acc);
          continue;
        }
        if (f == QuantFormat::kQ6_K || f == QuantFormat::kQ3_K) {
          acc = std::fma(blk.dw[0] * d[b], static_cast<float>(isum[0]), acc);
          acc = std::fma(blk.dw[1] * d[b], static_cast<float>(isum[1]), acc);
          continue;
        }
        acc = std::fma(blk.dw[0] * d[b], static_cast<float>(isum[0] + isum[1]), acc);
        if (WithMin(f) || KWithMin(f)) acc = std::fma(blk.m, dsum[b], acc);
      }
      y[static_cast<size_t>(i) * n + j] = bias != nullptr ? acc + bias[j] : acc;
    }
  }
  return y;
}

std::unique_ptr<CpuBackend> Backend(int threads, CpuIsa isa, CpuGemm gemm = CpuGemm::kInvariant) {
  auto b = CpuBackend::Create({.num_threads = threads, .cpu_gemm = gemm, .cpu_isa = isa});
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
  // The file's bytes per padded row; Q4_K / Q5_K / Q3_K add their 6-bit scales unpacked (4 bytes
  // per 256).
  const bool unpacked_scales = KWithMin(f) || f == QuantFormat::kQ3_K;
  EXPECT_EQ((*pm)->bytes(), static_cast<int64_t>((n + 15) / 16 * 16) *
                                (k / cpu::QuantBlockElements(f)) *
                                (cpu::QuantBlockBytes(f) + (unpacked_scales ? 4 : 0)));
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
    for (auto [n, k32, m] : {std::tuple{40, 96, 1}, std::tuple{16, 32, 5}, std::tuple{67, 160, 9},
                             std::tuple{128, 64, 33}}) {
      const int k = Cols(f, k32);
      const auto w = RandomBlocks(f, n, k, 7 + n);
      const auto x = RandomVector(static_cast<size_t>(m) * k, 11 + m, -2.f, 2.f);
      const auto bias = RandomVector(n, 5);
      for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
        const std::vector<float> want = ModelOfKernel(f, w, n, k, x, m, b);
        for (CpuIsa isa : HostCpuPaths()) {
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

// A Q3_K matrix gives, on every path, the bits of the same values written as Q6_K blocks (its
// codes q + 4 with o = 4 against Q6_K's q + 32 with o = 32: the same integer sums and scales),
// at 3.5625 bits per weight against Q6_K's 6.5625.
TEST(QuantGemmTest, Q3KGivesTheBitsOfItsValuesWrittenAsQ6K) {
  const int n = 33, k = 512, m = 6;
  const auto q3 = RandomBlocks(QuantFormat::kQ3_K, n, k, 17);
  std::vector<uint8_t> q6(q3.size() / 110 * 210);
  for (size_t b = 0; b < q3.size() / 110; ++b) {
    KQuant6 blk;
    DecodeQ3KAsQ6K(q3.data() + 110 * b, &blk);
    EncodeQ6K(blk, q6.data() + 210 * b);
  }
  const auto x = RandomVector(static_cast<size_t>(m) * k, 19, -3.f, 3.f);
  for (CpuIsa isa : HostCpuPaths()) {
    auto backend = Backend(2, isa);
    const std::vector<float> want =
        MatMulStored(*backend, QuantFormat::kQ6_K, q6, n, k, x, m, nullptr);
    const std::vector<float> got =
        MatMulStored(*backend, QuantFormat::kQ3_K, q3, n, k, x, m, nullptr);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_TRUE(SameBits(got.data(), want.data(), got.size())) << cpu::CpuIsaName(isa);
  }
}

// The largest codes against the largest activation codes (every code byte 0xff: Q4_x 15, Q5_x
// 31, Q6_K 63, Q2_K 3, Q3_K 3, Q8_0 -1, and 0x80: -128; 0x00: Q3_K -4; K-quant scales 63 or,
// for Q6_K, -1 and -128, Q2_K's scales and mins 15, Q3_K's 31 and -32; x constant, so every
// activation code is +-127): the integer sums must not saturate or wrap on any path (int16
// partial sums hold only so many products).
TEST(QuantGemmTest, ExtremeCodesAreExactOnEveryPath) {
  const int n = 32;
  // 19: one 16-row AMX tile and three rows past it.
  for (int m : {3, 19}) {
    for (QuantFormat f : kFormats) {
      const int k = Cols(f, 128);
      for (uint8_t fill : {uint8_t{0xff}, uint8_t{0x80}, uint8_t{0x00}}) {
        std::vector<uint8_t> w = RandomBlocks(f, n, k, 3);
        const int bb = cpu::QuantBlockBytes(f);
        const auto [first, last] = PayloadBytes(f);
        for (size_t b = 0; b < w.size() / bb; ++b) {
          std::memset(w.data() + b * bb + first, fill, last - first);
        }
        for (float v : {1.f, -1.f}) {
          const std::vector<float> x(static_cast<size_t>(m) * k, v);
          const std::vector<float> want = ModelOfKernel(f, w, n, k, x, m, nullptr);
          for (CpuIsa isa : HostCpuPaths()) {
            auto backend = Backend(1, isa);
            const std::vector<float> got = MatMulStored(*backend, f, w, n, k, x, m, nullptr);
            ASSERT_EQ(got.size(), want.size());
            EXPECT_TRUE(SameBits(got.data(), want.data(), got.size()))
                << cpu::QuantFormatName(f) << " " << cpu::CpuIsaName(isa) << " m=" << m
                << " fill=" << int{fill} << " x=" << v << ": " << got[0] << " vs " << want[0];
          }
        }
      }
    }
  }
}

// Each activation code is the nearest step: |x - d q| <= d / 2 (to float rounding), |q| <= 127,
// the block's largest |x| maps to +-127, and sum / sum_lo / dsum are the codes' sum, the sum of
// the first 16 and d times the sum.
TEST(QuantGemmTest, ActivationCodesAreTheNearestStep) {
  const int k = 256;
  auto x = RandomVector(k, 31, -3.f, 3.f);
  x[40] = 0.f;
  for (int e = 64; e < 96; ++e) x[e] = 0.f;  // an all-zero block: d = 0, codes 0
  std::vector<int8_t> q(k);
  std::vector<float> d(k / 32), dsum(k / 32);
  std::vector<int32_t> sum(k / 32), sum_lo(k / 32);
  cpu::QuantizeActivationRow(x.data(), k, q.data(), d.data(), sum.data(), sum_lo.data(),
                             dsum.data());
  for (int b = 0; b < k / 32; ++b) {
    int32_t s = 0;
    float amax = 0;
    for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(x[b * 32 + e]));
    EXPECT_EQ(d[b], amax / 127.f);
    for (int e = 0; e < 32; ++e) {
      const int i = b * 32 + e;
      EXPECT_LE(std::abs(q[i]), 127);
      EXPECT_LE(std::fabs(x[i] - d[b] * q[i]), 0.5f * d[b] * (1 + 1e-5f)) << "element " << i;
      if (std::fabs(x[i]) == amax && amax > 0) {
        EXPECT_EQ(std::abs(q[i]), 127);
      }
      s += q[i];
      if (e == 15) {
        EXPECT_EQ(sum_lo[b], s);
      }
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
    double worst = 0;
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double ref = 0, bound = 0, mag = 0;
        for (int b = 0; b < k / 32; ++b) {
          const Block32 blk = ReadBlock(f, w, k, j, b);
          double amax = 0;
          for (int e = 0; e < 32; ++e)
            amax = std::max(amax, std::fabs(double(x[i * k + b * 32 + e])));
          for (int e = 0; e < 32; ++e) {
            const double wv = Dequant(f, blk, e), xv = x[i * k + b * 32 + e];
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
  const int n = 200;
  for (QuantFormat f : kFormats) {
    const int k = Cols(f, 192);
    const auto w = RandomBlocks(f, n, k, 21);
    const auto bias = RandomVector(n, 22);
    const auto rows = RandomVector(static_cast<size_t>(64) * k, 23, -3.f, 3.f);
    for (CpuIsa isa : HostCpuPaths()) {
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
  const auto paths = HostCpuPaths();
  if (paths.size() < 2) GTEST_SKIP() << "only the scalar path runs here";
  for (QuantFormat f : kFormats) {
    for (auto [n, k32] : {std::pair{576, 1536}, std::pair{192, 576}}) {
      const int k = Cols(f, k32);
      const auto w = RandomBlocks(f, n, k, n + k);
      const int m = 20;  // a 16-row tile (AMX's) and four rows
      const auto x = RandomVector(static_cast<size_t>(m) * k, 99, -4.f, 4.f);
      auto scalar = Backend(2, CpuIsa::kScalar);
      const std::vector<float> want = MatMulStored(*scalar, f, w, n, k, x, m, nullptr);
      for (CpuIsa isa : paths) {
        auto backend = Backend(2, isa);
        EXPECT_TRUE(SameBits(MatMulStored(*backend, f, w, n, k, x, m, nullptr).data(), want.data(),
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
  for (CpuIsa isa : HostCpuPaths()) {
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
  auto refused = cpu::ResolveCpuIsa(CpuIsa::kAvx512Vnni, avx2_only);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("avx512f"), std::string::npos) << refused.status();
  cpu::CpuFeatures no_vnni = avx2_only;
  no_vnni.avx512f = no_vnni.avx512bw = no_vnni.avx512vl = true;
  refused = cpu::ResolveCpuIsa(CpuIsa::kAvx512Vnni, no_vnni);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("avx512_vnni"), std::string::npos);
  EXPECT_EQ(*cpu::ResolveCpuIsa(std::nullopt, no_vnni), CpuIsa::kAvx512);
  EXPECT_EQ(*cpu::ResolveCpuIsa(std::nullopt, avx2_only), CpuIsa::kAvx2);
  EXPECT_EQ(*cpu::ResolveCpuIsa(std::nullopt, cpu::CpuFeatures{}), CpuIsa::kScalar);
  // AMX needs its tile state granted as well as the CPU's AMX-INT8.
  cpu::CpuFeatures bf16 = no_vnni;
  bf16.avx512vnni = bf16.avx512bf16 = true;
  bf16.amx_int8 = true;
  EXPECT_EQ(*cpu::ResolveCpuIsa(std::nullopt, bf16), CpuIsa::kAvx512Bf16);
  refused = cpu::ResolveCpuIsa(CpuIsa::kAmx, bf16);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("amx_tile"), std::string::npos) << refused.status();
  cpu::CpuFeatures amx = bf16;
  amx.amx_tile = true;
  EXPECT_EQ(*cpu::ResolveCpuIsa(CpuIsa::kAmx, amx), CpuIsa::kAmx);
  EXPECT_EQ(*cpu::ResolveCpuIsa(std::nullopt, amx), CpuIsa::kAvx512Bf16);  // amx by name only
  amx.amx_int8 = false;
  refused = cpu::ResolveCpuIsa(CpuIsa::kAmx, amx);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("amx_int8"), std::string::npos) << refused.status();
  for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx512Vnni, CpuIsa::kAvx512Bf16, CpuIsa::kAmx}) {
    auto b = CpuBackend::Create({.cpu_isa = isa});
    if (!cpu::HostCpuFeatures().avx512f) {
      ASSERT_FALSE(b.ok()) << cpu::CpuIsaName(isa);
      EXPECT_NE(b.status().message().find("lacks"), std::string::npos) << b.status();
    }
  }
}

// --cpu_isa: every path's name parses back to it; "auto" is the caller's std::nullopt, and an
// unknown name is refused listing the valid ones.
TEST(QuantGemmTest, CpuIsaNamesRoundTripAndOthersAreRefused) {
  for (CpuIsa isa : cpu::kAllCpuIsas) EXPECT_EQ(*cpu::ParseCpuIsa(cpu::CpuIsaName(isa)), isa);
  auto unknown = cpu::ParseCpuIsa("sse9");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().message(),
            "unknown cpu_isa 'sse9': valid values are scalar, avx2, avx512, avx512_vnni, "
            "avx512_bf16, amx");
  EXPECT_FALSE(cpu::ParseCpuIsa("auto").ok());
  EXPECT_EQ(*ParseOrAuto<CpuIsa>("auto", cpu::ParseCpuIsa), std::nullopt);
  EXPECT_EQ(*ParseOrAuto<CpuIsa>("avx2", cpu::ParseCpuIsa), CpuIsa::kAvx2);
  EXPECT_NE(ParseOrAuto<CpuIsa>("sse9", cpu::ParseCpuIsa).status().message().find("or auto"),
            std::string::npos);
}

TEST(QuantGemmTest, UnsupportedFormatsAndGemmsAreRefusedByName) {
  auto backend = Backend(1, CpuIsa::kScalar);
  const auto w = RandomBlocks(QuantFormat::kQ4_1, 16, 64, 1);
  auto odd = backend->PrepareStoredMatrix(
      {.format = WeightFormat::kQ4_1, .data = w.data(), .rows = 16, .cols = 48});
  EXPECT_FALSE(odd.ok());
  // A K-quant row is whole super-blocks of 256.
  const auto wk = RandomBlocks(QuantFormat::kQ6_K, 16, 512, 1);
  auto short_k = backend->PrepareStoredMatrix(
      {.format = WeightFormat::kQ6_K, .data = wk.data(), .rows = 16, .cols = 288});
  ASSERT_FALSE(short_k.ok());
  EXPECT_NE(short_k.status().message().find("multiple of 256"), std::string::npos)
      << short_k.status();
  // The OpenBLAS GEMM takes f32 weights only (where this build has OpenBLAS).
  auto blas = CpuBackend::Create({.num_threads = 1, .cpu_gemm = CpuGemm::kOpenBlas});
  if (blas.ok()) {
    auto b = (*blas)->PrepareStoredMatrix(
        {.format = WeightFormat::kQ4_1, .data = w.data(), .rows = 16, .cols = 64});
    ASSERT_FALSE(b.ok());
    EXPECT_NE(b.status().message().find("openblas"), std::string::npos) << b.status();
  }
}

// Embedding rows from a kept matrix are ggml's dequantized values (times the scale).
TEST(QuantGemmTest, EmbedFromMatrixIsTheDequantizedRow) {
  const int n = 37;
  for (QuantFormat f : kFormats) {
    const int k = Cols(f, 64);
    const auto w = RandomBlocks(f, n, k, 8);
    auto backend = Backend(2, HostCpuPaths().back());
    auto pm = backend->PrepareStoredMatrix(
        {.format = ToWeightFormat(f), .data = w.data(), .rows = n, .cols = k});
    ASSERT_TRUE(pm.ok()) << pm.status();
    const std::vector<int32_t> ids = {36, 0, 17};
    std::vector<float> out(ids.size() * k);
    ASSERT_TRUE(backend->EmbedFromMatrix(**pm, ids.data(), 3, 2.5f, out.data()).ok());
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int e = 0; e < k; ++e) {
        const Block32 blk = ReadBlock(f, w, k, ids[i], e / 32);
        EXPECT_EQ(out[i * k + e], Dequant(f, blk, e % 32) * 2.5f)
            << cpu::QuantFormatName(f) << " row " << ids[i] << " element " << e;
      }
    }
    const int32_t bad = n;
    EXPECT_FALSE(backend->EmbedFromMatrix(**pm, &bad, 1, 1.f, out.data()).ok());
  }
}

}  // namespace
}  // namespace duet::compute
