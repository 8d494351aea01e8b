#include "common/base/float16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "common/weights/safetensors.h"

namespace duet::model {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

TEST(Float16Test, HalfKnownPatterns) {
  EXPECT_EQ(Bits(HalfToFloat(0x0000)), 0x00000000u);
  EXPECT_EQ(Bits(HalfToFloat(0x8000)), 0x80000000u);  // -0
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);                  // largest normal
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(HalfToFloat(0x8200), -std::ldexp(1.0f, -15));
  EXPECT_EQ(HalfToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0xfc01)));
}

TEST(Float16Test, HalfRoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << std::hex << h;
      EXPECT_EQ(FloatToHalf(f) & 0x8000, h & 0x8000);
    } else {
      ASSERT_EQ(FloatToHalf(f), h) << std::hex << h << " " << f;
    }
  }
}

TEST(Float16Test, FloatToHalfRoundsToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.1f, -11)), 0x3c01);      // above the tie
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // overflows to inf
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie -> 0
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp tie -> even 2
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.5f, -24)), 0x0400);  // rounds into normals
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
}

TEST(Float16Test, Bf16KnownPatterns) {
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0xc000), -2.0f);
  EXPECT_EQ(Bf16ToFloat(0x3e80), 0.25f);
  EXPECT_EQ(Bf16ToFloat(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bits(Bf16ToFloat(0x0001)), 0x00010000u);  // subnormal
  EXPECT_TRUE(std::isnan(Bf16ToFloat(0x7fc0)));
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.5f, -8)), 0x3f81);
  EXPECT_EQ(FloatToBf16(3.4e38f), 0x7f80);  // rounds up to inf
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::bit_cast<float>(0x7f800001u)))));
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(FloatToBf16(f), b) << std::hex << b;
    }
  }
}

TEST(Float16Test, ConvertToFloatHandlesUnalignedSources) {
  const uint16_t halves[] = {0x3c00, 0xc000, 0x0001, 0x7c00};
  const uint16_t bf16[] = {0x3f80, 0xc000, 0x3e80, 0xff80};
  const float f32[] = {1.5f, -0.25f, 1e-30f, 7.0f};
  const double f64[] = {0.5, -8.0, 3.25, 1e300};
  std::vector<uint8_t> buf(1 + sizeof(f64));
  float out[4];
  std::memcpy(buf.data() + 1, halves, sizeof(halves));
  ASSERT_TRUE(ConvertToFloat(Dtype::kF16, buf.data() + 1, 4, out).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(out[3]));
  std::memcpy(buf.data() + 1, bf16, sizeof(bf16));
  ASSERT_TRUE(ConvertToFloat(Dtype::kBF16, buf.data() + 1, 4, out).ok());
  EXPECT_EQ(out[2], 0.25f);
  EXPECT_EQ(out[3], -std::numeric_limits<float>::infinity());
  std::memcpy(buf.data() + 1, f32, sizeof(f32));
  ASSERT_TRUE(ConvertToFloat(Dtype::kF32, buf.data() + 1, 4, out).ok());
  EXPECT_EQ(out[2], 1e-30f);
  std::memcpy(buf.data() + 1, f64, sizeof(f64));
  ASSERT_TRUE(ConvertToFloat(Dtype::kF64, buf.data() + 1, 4, out).ok());
  EXPECT_EQ(out[1], -8.0f);
  EXPECT_TRUE(std::isinf(out[3]));
  absl::Status s = ConvertToFloat(Dtype::kI32, buf.data(), 1, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("I32"), absl::string_view::npos);
}

}  // namespace
}  // namespace duet::model
