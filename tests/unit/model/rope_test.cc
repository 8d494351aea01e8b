#include "common/model/rope.h"

#include <gtest/gtest.h>

#include <cmath>

namespace duet::model {
namespace {

ModelConfig Base(int head_dim, float theta) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.head_dim = head_dim;
  c.rope_theta = theta;
  return c;
}

TEST(RopeTest, PlainInverseFrequencies) {
  ModelConfig c = Base(16, 10000.0f);
  std::vector<float> f = RopeInvFreq(c);
  ASSERT_EQ(f.size(), 8u);
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  EXPECT_FLOAT_EQ(f[1], 0.31622776601683794f);     // 10000^(-1/8)
  EXPECT_FLOAT_EQ(f[4], 0.01f);                    // 10000^(-4/8)
  EXPECT_FLOAT_EQ(f[7], 0.00031622776601683794f);  // 10000^(-7/8)
  for (size_t i = 1; i < f.size(); ++i) EXPECT_LT(f[i], f[i - 1]);
}

// Llama 3's rule written independently, as a piecewise function of the wavelength (the form of
// the Llama 3 reference code rather than HF's torch.where form used by RopeInvFreq).
double Llama3Reference(double base_freq, double factor, double low, double high, double old_ctx) {
  const double wavelen = 2 * M_PI / base_freq;
  if (wavelen < old_ctx / high) return base_freq;
  if (wavelen > old_ctx / low) return base_freq / factor;
  const double smooth = (old_ctx / wavelen - low) / (high - low);
  return (1 - smooth) * base_freq / factor + smooth * base_freq;
}

TEST(RopeTest, Llama3ScalingMatchesReference) {
  ModelConfig c = Base(128, 500000.0f);
  c.rope_scaling = RopeScaling{.rope_type = "llama3",
                               .factor = 8,
                               .low_freq_factor = 1,
                               .high_freq_factor = 4,
                               .original_max_position_embeddings = 8192};
  std::vector<float> f = RopeInvFreq(c);
  ASSERT_EQ(f.size(), 64u);
  int high = 0, low = 0, medium = 0;
  for (int i = 0; i < 64; ++i) {
    const double base = std::pow(500000.0, -2.0 * i / 128.0);
    const double want = Llama3Reference(base, 8, 1, 4, 8192);
    EXPECT_NEAR(f[i], want, 1e-7 * want) << i;
    const double wavelen = 2 * M_PI / base;
    if (wavelen < 2048) {
      ++high;
      EXPECT_FLOAT_EQ(f[i], static_cast<float>(base));
    } else if (wavelen > 8192) {
      ++low;
      EXPECT_FLOAT_EQ(f[i], static_cast<float>(base / 8));
    } else {
      ++medium;
      EXPECT_LT(f[i], base);
      EXPECT_GT(f[i], base / 8);
    }
  }
  // All three regimes are exercised for Llama 3.1 8B's geometry.
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(medium, 0);
  // Known values: the first frequency is untouched, the last is 500000^(-126/128) / 8.
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  EXPECT_NEAR(f[63], 3.068926e-7, 1e-12);
  for (size_t i = 1; i < f.size(); ++i) EXPECT_LT(f[i], f[i - 1]);
}

TEST(RopeTest, ScalingChangesOnlyLowFrequencies) {
  ModelConfig plain = Base(64, 10000.0f);
  ModelConfig scaled = plain;
  scaled.rope_scaling = RopeScaling{.rope_type = "llama3",
                                    .factor = 4,
                                    .low_freq_factor = 1,
                                    .high_freq_factor = 4,
                                    .original_max_position_embeddings = 256};
  std::vector<float> a = RopeInvFreq(plain), b = RopeInvFreq(scaled);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_NE(a.back(), b.back());
  EXPECT_FLOAT_EQ(b.back(), a.back() / 4);
}

}  // namespace
}  // namespace duet::model
