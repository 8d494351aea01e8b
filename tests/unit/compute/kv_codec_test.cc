// The KV codec (common/compute/cpu/kv_codec.h): FP8 E4M3 conversions, int8 scales, and the SIMD
// decoders giving the portable decoder's bits.
#include "common/compute/cpu/kv_codec.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/base/float8.h"
#include "gtest/gtest.h"

namespace duet::compute::cpu {
namespace {

TEST(Fp8E4M3Test, EveryCodeRoundTrips) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const float f = Fp8E4M3ToFloat(static_cast<uint8_t>(c));
    if (std::isnan(f)) {
      ++nans;
      EXPECT_EQ(c & 0x7f, 0x7f);
      continue;
    }
    EXPECT_EQ(FloatToFp8E4M3(f), c) << "code " << c << " = " << f;
  }
  EXPECT_EQ(nans, 2);
}

TEST(Fp8E4M3Test, KnownValuesTiesAndSaturation) {
  EXPECT_EQ(Fp8E4M3ToFloat(0x38), 1.f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), std::ldexp(1.f, -9));  // smallest subnormal
  EXPECT_EQ(Fp8E4M3ToFloat(0x08), std::ldexp(1.f, -6));  // smallest normal
  EXPECT_EQ(FloatToFp8E4M3(1.1f), 0x39);                 // 1.125
  EXPECT_EQ(FloatToFp8E4M3(1.0625f), 0x38);              // tie between 1 and 1.125: even
  EXPECT_EQ(FloatToFp8E4M3(1.1875f), 0x3a);              // tie between 1.125 and 1.25: even
  EXPECT_EQ(FloatToFp8E4M3(-1.1875f), 0xba);
  EXPECT_EQ(FloatToFp8E4M3(449.f), 0x7e);  // saturates, never NaN
  EXPECT_EQ(FloatToFp8E4M3(1e30f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(-INFINITY), 0xfe);
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.f, -10)), 0x00);  // tie between 0 and 2^-9: even
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(3.f, -10)), 0x02);  // tie between 2^-9 and 2^-8: even
  EXPECT_EQ(FloatToFp8E4M3(0.0155f), 0x08);               // rounds up into the normals
}

TEST(KvCodecTest, Int8ScalesPerHeadAndRoundsToNearestEven) {
  const float x[6] = {63.5f, -127.f, 30.5f, 0.f, 0.f, 0.f};  // two heads of 3; scale 1
  int8_t codes[6];
  float scales[2];
  EncodeKvToken(kv::KvDtype::kInt8, x, 2, 3, codes, scales);
  EXPECT_EQ(scales[0], 1.f);
  EXPECT_EQ(codes[0], 64);  // 63.5 -> 64 (even)
  EXPECT_EQ(codes[1], -127);
  EXPECT_EQ(codes[2], 30);    // 30.5 -> 30 (even)
  EXPECT_EQ(scales[1], 0.f);  // an all-zero head
  EXPECT_EQ(codes[3], 0);
  float back[3];
  DecodeKvHead(kv::KvDtype::kInt8, codes, scales[0], 3, back);
  EXPECT_EQ(back[1], -127.f);
  DecodeKvHead(kv::KvDtype::kInt8, codes + 3, scales[1], 3, back);
  EXPECT_EQ(back[0], 0.f);
}

TEST(KvCodecTest, Fp8ScalesTheHeadMaximumTo448) {
  const float x[4] = {0.25f, -3.f, 1.5f, 0.001f};
  uint8_t codes[4];
  float scale;
  EncodeKvToken(kv::KvDtype::kFp8E4M3, x, 1, 4, codes, &scale);
  EXPECT_FLOAT_EQ(scale, 3.f / 448.f);
  EXPECT_EQ(codes[1], 0xfe);  // -448
  float back[4];
  DecodeKvHead(kv::KvDtype::kFp8E4M3, codes, scale, 4, back);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(back[i], x[i], std::fabs(x[i]) / 16 + 1e-5) << i;
}

// The AVX2 decoders and the portable one give the same bits, for every dtype and head size
// (vector bodies and scalar tails).
TEST(KvCodecTest, SimdAndPortableDecodersAgreeBitwise) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-8.f, 8.f);
  for (kv::KvDtype dtype : {kv::KvDtype::kF32, kv::KvDtype::kBF16, kv::KvDtype::kF16,
                            kv::KvDtype::kInt8, kv::KvDtype::kFp8E4M3}) {
    for (int d = 1; d <= 70; ++d) {
      std::vector<float> x(d);
      for (float& v : x) v = u(rng);
      std::vector<uint8_t> codes(static_cast<size_t>(d) * 4);
      float scale = 1.f;
      EncodeKvToken(dtype, x.data(), 1, d, codes.data(), &scale);
      if (!kv::KvDtypeHasScales(dtype)) scale = 1.f;
      std::vector<float> fast(d), slow(d);
      DecodeKvHead(dtype, codes.data(), scale, d, fast.data());
      DecodeKvHeadPortable(dtype, codes.data(), scale, d, slow.data());
      EXPECT_EQ(std::memcmp(fast.data(), slow.data(), d * sizeof(float)), 0)
          << kv::KvDtypeName(dtype) << " d=" << d;
    }
  }
}

// DecodeKvRows (the dtype dispatched once, rows strided as in a block) gives DecodeKvHead's bits
// row by row, every fp8 code included (NaN codes decode to NaN on both paths).
TEST(KvCodecTest, RowDecoderAgreesWithTheHeadDecoder) {
  std::mt19937 rng(9);
  for (kv::KvDtype dtype : {kv::KvDtype::kF32, kv::KvDtype::kBF16, kv::KvDtype::kF16,
                            kv::KvDtype::kInt8, kv::KvDtype::kFp8E4M3}) {
    for (int d : {8, 20, 64, 256}) {
      const int rows = 5, nkv = 3;
      const size_t eb = kv::KvDtypeBytes(dtype);
      std::vector<uint8_t> codes(static_cast<size_t>(rows) * nkv * d * eb);
      for (uint8_t& c : codes) c = static_cast<uint8_t>(rng());
      if (dtype == kv::KvDtype::kF32 || dtype == kv::KvDtype::kF16 || dtype == kv::KvDtype::kBF16) {
        // Real values, not random bit patterns (whose NaN payloads need not survive).
        std::vector<float> x(static_cast<size_t>(rows) * nkv * d);
        for (float& v : x) v = std::uniform_real_distribution<float>(-4.f, 4.f)(rng);
        for (int r = 0; r < rows; ++r) {
          EncodeKvToken(dtype, x.data() + r * nkv * d, nkv, d, codes.data() + r * nkv * d * eb,
                        nullptr);
        }
      }
      std::vector<float> scales(static_cast<size_t>(rows) * nkv);
      for (float& s : scales) s = std::uniform_real_distribution<float>(0.001f, 2.f)(rng);
      for (int h = 0; h < nkv; ++h) {
        std::vector<float> got(static_cast<size_t>(rows) * d), want(got.size());
        DecodeKvRows(dtype, codes.data() + h * d * eb, static_cast<int64_t>(nkv) * d * eb,
                     scales.data() + h, nkv, rows, d, got.data());
        for (int r = 0; r < rows; ++r) {
          DecodeKvHeadPortable(dtype, codes.data() + (r * nkv + h) * d * eb,
                               kv::KvDtypeHasScales(dtype) ? scales[r * nkv + h] : 1.f, d,
                               want.data() + r * d);
        }
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << kv::KvDtypeName(dtype) << " d=" << d << " head " << h;
      }
    }
  }
}

}  // namespace
}  // namespace duet::compute::cpu
