// The logit processing and min_p of common/sampling/sampling.h against hand-computed values:
// logit_bias added, banned ids at -inf, the repetition penalty over prompt and output tokens
// (l > 0 ? l / p : l * p), frequency and presence penalties over output tokens only, min_p at
// the temperature; the logprobs stay those of the raw logits.
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "common/compute/compute_backend.h"
#include "common/sampling/sampling.h"
#include "gtest/gtest.h"

namespace duet::compute {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(LogitProcessingTest, BiasBanAndPenaltiesByHand) {
  std::vector<float> l = {2.f, -1.f, 0.5f, 3.f, 0.f, -2.f};
  const std::vector<PenaltyToken> penalty = {{0, 0}, {1, 0}, {4, 2}};  // 0, 1: prompt only
  const std::vector<LogitBias> bias = {{2, 1.f}, {5, -100.f}};
  const std::vector<int32_t> banned = {3};
  const RowSampling p{.repetition_penalty = 2.f,
                      .presence_penalty = 0.5f,
                      .frequency_penalty = 0.25f,
                      .penalty_tokens = penalty,
                      .logit_bias = bias,
                      .banned_ids = banned};
  EXPECT_TRUE(HasLogitProcessing(p));
  ASSERT_TRUE(ValidateRowSampling(1, 6, {p}).ok());
  ProcessLogitsOnHost(l.data(), 6, p);
  // 2 / 2; -1 * 2; 0.5 + 1; banned; 0 * 2 - 0.25 * 2 - 0.5; -2 - 100.
  EXPECT_EQ(l, (std::vector<float>{1.f, -2.f, 1.5f, -kInf, -1.f, -102.f}));
}

TEST(LogitProcessingTest, PresenceAndFrequencyCountOnlyOutputTokens) {
  const std::vector<PenaltyToken> penalty = {{0, 0}, {1, 3}};
  std::vector<float> l = {1.f, 1.f};
  ProcessLogitsOnHost(
      l.data(), 2,
      {.presence_penalty = 0.5f, .frequency_penalty = 0.1f, .penalty_tokens = penalty});
  EXPECT_EQ(l[0], 1.f);  // in the prompt only: no presence or frequency penalty
  EXPECT_FLOAT_EQ(l[1], 1.f - 0.3f - 0.5f);
  // Negative penalties encourage repeats.
  l = {1.f, 1.f};
  ProcessLogitsOnHost(l.data(), 2, {.presence_penalty = -1.f, .penalty_tokens = penalty});
  EXPECT_EQ(l, (std::vector<float>{1.f, 2.f}));
}

TEST(LogitProcessingTest, InactivePenaltiesLeaveTheRowAlone) {
  const std::vector<PenaltyToken> penalty = {{0, 4}};
  EXPECT_FALSE(HasLogitProcessing({.penalty_tokens = penalty}));
  EXPECT_FALSE(HasLogitProcessing({.repetition_penalty = 1.3f}));  // no tokens yet
  EXPECT_TRUE(HasLogitProcessing({.repetition_penalty = 1.3f, .penalty_tokens = penalty}));
}

TEST(LogitProcessingTest, GreedyTakesTheProcessedArgmaxAndReportsRawLogprobs) {
  const std::vector<float> l = {1.f, 3.f, 2.f};
  const std::vector<LogitBias> bias = {{1, -100.f}};
  const SampledToken t = SampleRowOnHost(l.data(), 3, {.num_logprobs = 2, .logit_bias = bias});
  EXPECT_EQ(t.id, 2);
  const double log_z = std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0));
  EXPECT_NEAR(t.logprob, 2.0 - log_z, 1e-6);
  ASSERT_EQ(t.top_logprobs.size(), 2u);  // of the raw logits: token 1 still first
  EXPECT_EQ(t.top_logprobs[0].first, 1);
  EXPECT_NEAR(t.top_logprobs[0].second, 3.0 - log_z, 1e-6);

  // A repetition penalty of 1.5 on token 0 (2 -> 1.33) lets token 1 (1.5) win.
  const std::vector<float> r = {2.f, 1.5f};
  const std::vector<PenaltyToken> seen = {{0, 0}};
  EXPECT_EQ(SampleRowOnHost(r.data(), 2, {}).id, 0);
  EXPECT_EQ(SampleRowOnHost(r.data(), 2, {.repetition_penalty = 1.5f, .penalty_tokens = seen}).id,
            1);
  // A banned argmax gives way to the next.
  const std::vector<int32_t> banned = {1};
  EXPECT_EQ(SampleRowOnHost(l.data(), 3, {.banned_ids = banned}).id, 2);
}

// The ids drawn over many seeds.
std::set<int32_t> Drawn(const std::vector<float>& l, RowSampling p) {
  std::set<int32_t> ids;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    p.seed = seed;
    ids.insert(SampleRowOnHost(l.data(), static_cast<int>(l.size()), p).id);
  }
  return ids;
}

TEST(LogitProcessingTest, MinPKeepsTokensAtLeastMinPTimesTheBestProbability) {
  // Probabilities relative to the best at temperature 1: 1, 0.5, 0.2, 0.05.
  const std::vector<float> l = {0.f, std::log(0.5f), std::log(0.2f), std::log(0.05f)};
  EXPECT_EQ(Drawn(l, {.temperature = 1.f}), (std::set<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(Drawn(l, {.temperature = 1.f, .min_p = 0.3f}), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(Drawn(l, {.temperature = 1.f, .min_p = 0.1f}), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(Drawn(l, {.temperature = 1.f, .min_p = 1.f}), (std::set<int32_t>{0}));
  // At temperature 2 they are the square roots: 1, 0.71, 0.45, 0.22.
  EXPECT_EQ(Drawn(l, {.temperature = 2.f, .min_p = 0.3f}), (std::set<int32_t>{0, 1, 2}));
  // With top_k the tighter cut wins.
  EXPECT_EQ(Drawn(l, {.temperature = 2.f, .top_k = 2, .min_p = 0.3f}), (std::set<int32_t>{0, 1}));
}

TEST(LogitProcessingTest, BadInputsAreRefused) {
  const std::vector<int32_t> unsorted = {3, 1};
  const std::vector<int32_t> out_of_vocab = {9};
  const std::vector<int32_t> all = {0, 1, 2, 3};
  const std::vector<LogitBias> twice = {{1, 1.f}, {1, 2.f}};
  const std::vector<LogitBias> nan_bias = {{1, std::nanf("")}};
  const std::vector<PenaltyToken> bad_token = {{4, 1}};
  for (const RowSampling& p : std::vector<RowSampling>{
           {.min_p = -0.1f},
           {.min_p = 1.5f},
           {.repetition_penalty = 0.f},
           {.repetition_penalty = kInf},
           {.presence_penalty = kInf},
           {.frequency_penalty = std::nanf("")},
           {.penalty_tokens = bad_token},
           {.logit_bias = twice},
           {.logit_bias = nan_bias},
           {.banned_ids = unsorted},
           {.banned_ids = out_of_vocab},
           {.banned_ids = all},
       }) {
    EXPECT_EQ(ValidateRowSampling(1, 4, {p}).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(LogitProcessingTest, CpuBackendProcessesEachRowAsSampleRowOnHost) {
  auto backend = CreateBackend(compute::Device::kCpu, {.num_threads = 2});
  ASSERT_TRUE(backend.ok()) << backend.status();
  const int vocab = 97;
  std::vector<float> logits(3 * vocab);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.61f * i) * 3.f;
  const std::vector<PenaltyToken> penalty = {{5, 2}, {17, 0}, {40, 1}};
  const std::vector<LogitBias> bias = {{3, 4.f}, {60, -100.f}};
  const std::vector<int32_t> banned = {7, 8};
  const std::vector<RowSampling> params = {
      {.num_logprobs = 3,
       .repetition_penalty = 1.3f,
       .penalty_tokens = penalty,
       .logit_bias = bias},
      {.temperature = 0.8f,
       .seed = 5,
       .step = 2,
       .min_p = 0.05f,
       .presence_penalty = 0.4f,
       .frequency_penalty = 0.2f,
       .penalty_tokens = penalty,
       .banned_ids = banned},
      {.temperature = 1.2f, .top_p = 0.9f, .seed = 9, .num_logprobs = 2, .logit_bias = bias},
  };
  auto got = (*backend)->SampleRows(logits.data(), 3, vocab, params);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int r = 0; r < 3; ++r) {
    const SampledToken want = SampleRowOnHost(logits.data() + r * vocab, vocab, params[r]);
    EXPECT_EQ((*got)[r].id, want.id) << r;
    EXPECT_EQ((*got)[r].logprob, want.logprob) << r;
    EXPECT_EQ((*got)[r].top_logprobs, want.top_logprobs) << r;
  }
}

}  // namespace
}  // namespace duet::compute
