#include "common/sampling/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace duet::model {
namespace {

std::vector<float> Logits() { return {0.1f, 2.0f, -1.0f, 1.5f, 0.0f, 1.9f}; }

TEST(SamplerTest, GreedyIsArgmaxWithLowestIdOnTies) {
  auto l = Logits();
  EXPECT_EQ(Sample(l.data(), 6, {}, 0).id, 1);
  std::vector<float> tie = {1.f, 3.f, 3.f};
  EXPECT_EQ(Sample(tie.data(), 3, {}, 0).id, 1);
}

TEST(SamplerTest, LogprobsAreNormalisedAndSorted) {
  auto l = Logits();
  SamplingParams p;
  p.logprobs = 3;
  SampledToken t = Sample(l.data(), 6, p, 0);
  ASSERT_EQ(t.top_logprobs.size(), 3u);
  EXPECT_EQ(t.top_logprobs[0].first, 1);
  EXPECT_EQ(t.top_logprobs[1].first, 5);
  EXPECT_EQ(t.top_logprobs[2].first, 3);
  EXPECT_FLOAT_EQ(t.logprob, t.top_logprobs[0].second);
  double z = 0;
  for (float x : l) z += std::exp(x);
  EXPECT_NEAR(t.logprob, 2.0 - std::log(z), 1e-5);
}

TEST(SamplerTest, SeededSamplingIsAFunctionOfSeedAndStep) {
  auto l = Logits();
  SamplingParams p{.temperature = 1.0f, .seed = 42};
  for (int step = 0; step < 20; ++step) {
    EXPECT_EQ(Sample(l.data(), 6, p, step).id, Sample(l.data(), 6, p, step).id);
  }
  // Across steps and seeds the draws vary and follow the distribution roughly.
  std::map<int, int> counts;
  for (int step = 0; step < 4000; ++step) counts[Sample(l.data(), 6, p, step).id]++;
  double z = 0;
  for (float x : l) z += std::exp(x);
  for (int id = 0; id < 6; ++id) {
    const double expect = 4000 * std::exp(l[id]) / z;
    EXPECT_NEAR(counts[id], expect, 5 * std::sqrt(expect) + 5) << "id " << id;
  }
}

TEST(SamplerTest, TopKOneAndTinyTopPAreGreedy) {
  auto l = Logits();
  for (int step = 0; step < 50; ++step) {
    EXPECT_EQ(Sample(l.data(), 6, {.temperature = 2.f, .top_k = 1, .seed = 3}, step).id, 1);
    EXPECT_EQ(Sample(l.data(), 6, {.temperature = 2.f, .top_p = 0.01f, .seed = 3}, step).id, 1);
  }
}

TEST(SamplerTest, TopKRestrictsTheCandidates) {
  auto l = Logits();
  for (int step = 0; step < 200; ++step) {
    int id = Sample(l.data(), 6, {.temperature = 5.f, .top_k = 3, .seed = 9}, step).id;
    EXPECT_TRUE(id == 1 || id == 5 || id == 3) << id;
  }
}

TEST(SamplerTest, StopRules) {
  SamplingParams p{.max_tokens = 3, .stop_token_ids = {7}};
  EXPECT_EQ(CheckStop(p, {2}, 2, 1), StopReason::kEos);
  EXPECT_EQ(CheckStop(p, {2}, 7, 1), StopReason::kStopToken);
  EXPECT_EQ(CheckStop(p, {2}, 5, 3), StopReason::kMaxTokens);
  EXPECT_EQ(CheckStop(p, {2}, 5, 2), StopReason::kNone);
  p.ignore_eos = true;
  EXPECT_EQ(CheckStop(p, {2}, 2, 1), StopReason::kNone);
}

// The one stop rule adds the full context to CheckStop: after the token that fills it.
TEST(SamplerTest, StopAfterTokenEndsWhenTheContextIsFull) {
  const SamplingParams p{.max_tokens = 100, .stop_token_ids = {7}};
  EXPECT_EQ(StopAfterToken(p, {2}, 5, 1, /*held=*/30, /*max_positions=*/32), StopReason::kNone);
  EXPECT_EQ(StopAfterToken(p, {2}, 5, 1, 31, 32), StopReason::kNone);
  EXPECT_EQ(StopAfterToken(p, {2}, 5, 1, 32, 32), StopReason::kMaxTokens);
  EXPECT_EQ(StopAfterToken(p, {2}, 7, 1, 32, 32), StopReason::kStopToken);  // its own reason first
  EXPECT_EQ(StopAfterToken(p, {2}, 2, 1, 10, 32), StopReason::kEos);
}

TEST(SamplerTest, ValidateNamesTheBadParameter) {
  EXPECT_NE(SamplingParams{.temperature = -1}.Validate(10).message().find("temperature"),
            std::string::npos);
  EXPECT_NE(SamplingParams{.top_p = 0}.Validate(10).message().find("top_p"), std::string::npos);
  EXPECT_NE(SamplingParams{.max_tokens = 0}.Validate(10).message().find("max_tokens"),
            std::string::npos);
  EXPECT_NE(SamplingParams{.stop_token_ids = {10}}.Validate(10).message().find("stop token"),
            std::string::npos);
  EXPECT_TRUE(SamplingParams{}.Validate(10).ok());
}

}  // namespace
}  // namespace duet::model
