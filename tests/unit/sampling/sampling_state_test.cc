// SamplingState (the tokens the penalties and min_tokens see), ToRowSampling's use of it, the
// min_tokens stop rule and the new parameters' checks.
#include "common/sampling/sampling_state.h"

#include <vector>

#include "common/sampling/sampler.h"
#include "gtest/gtest.h"

namespace duet::model {
namespace {

using compute::PenaltyToken;

std::vector<std::pair<int32_t, int32_t>> Entries(const SamplingState& s) {
  std::vector<std::pair<int32_t, int32_t>> v;
  for (const PenaltyToken& t : s.penalty_tokens()) v.emplace_back(t.id, t.output_count);
  std::sort(v.begin(), v.end());
  return v;
}

TEST(SamplingStateTest, CountsOutputTokensAndRemembersThePromptForRepetition) {
  const std::vector<int32_t> prompt = {5, 5, 7};
  const std::vector<int32_t> generated = {7, 9};
  SamplingState rep(SamplingParams{.repetition_penalty = 1.2f}, {2}, prompt, generated);
  rep.AddGenerated(9);
  EXPECT_EQ(rep.generated(), 3);
  EXPECT_EQ(Entries(rep), (std::vector<std::pair<int32_t, int32_t>>{{5, 0}, {7, 1}, {9, 2}}));
  // Presence and frequency look at output tokens only: the prompt is not kept.
  SamplingState freq(SamplingParams{.frequency_penalty = 0.5f}, {2}, prompt, generated);
  EXPECT_EQ(Entries(freq), (std::vector<std::pair<int32_t, int32_t>>{{7, 1}, {9, 1}}));
  // Without penalties nothing is kept, but the count is.
  SamplingState none(SamplingParams{}, {2}, prompt, generated);
  EXPECT_TRUE(none.penalty_tokens().empty());
  EXPECT_EQ(none.generated(), 2);
}

TEST(SamplingStateTest, MinTokensBansEosAndStopTokensUntilReached) {
  const SamplingParams p{.max_tokens = 8, .stop_token_ids = {9, 3}, .min_tokens = 2};
  SamplingState s(p, {2, 3}, {1}, {});
  EXPECT_EQ(std::vector<int32_t>(s.stop_ids().begin(), s.stop_ids().end()),
            (std::vector<int32_t>{2, 3, 9}));
  EXPECT_EQ(ToRowSampling(p, 0, &s).banned_ids.size(), 3u);
  EXPECT_EQ(ToRowSampling(p, 1, &s).banned_ids.size(), 3u);
  EXPECT_TRUE(ToRowSampling(p, 2, &s).banned_ids.empty());
  SamplingParams keep_eos = p;
  keep_eos.ignore_eos = true;
  SamplingState k(keep_eos, {2, 3}, {1}, {});
  EXPECT_EQ(std::vector<int32_t>(k.stop_ids().begin(), k.stop_ids().end()),
            (std::vector<int32_t>{3, 9}));
  EXPECT_TRUE(SamplingState(SamplingParams{}, {2}, {1}, {}).stop_ids().empty());
}

TEST(SamplingStateTest, ToRowSamplingCarriesEveryParameter) {
  const SamplingParams p{.temperature = 0.5f,
                         .min_p = 0.1f,
                         .repetition_penalty = 1.1f,
                         .presence_penalty = 0.3f,
                         .frequency_penalty = -0.2f,
                         .logit_bias = {{4, 2.f}}};
  const SamplingState s(p, {}, {4}, {});
  const compute::RowSampling row = ToRowSampling(p, 0, &s);
  EXPECT_EQ(row.min_p, 0.1f);
  EXPECT_EQ(row.repetition_penalty, 1.1f);
  EXPECT_EQ(row.presence_penalty, 0.3f);
  EXPECT_EQ(row.frequency_penalty, -0.2f);
  ASSERT_EQ(row.logit_bias.size(), 1u);
  EXPECT_EQ(row.logit_bias[0].bias, 2.f);
  ASSERT_EQ(row.penalty_tokens.size(), 1u);
  EXPECT_EQ(row.penalty_tokens[0].id, 4);
  EXPECT_TRUE(p.NeedsState());
  const SamplingParams bias_only{.logit_bias = {{4, 2.f}}};
  EXPECT_FALSE(bias_only.NeedsState());
  EXPECT_TRUE(SamplingParams{.min_tokens = 1}.NeedsState());
}

TEST(SamplingStateTest, EosBeforeMinTokensDoesNotStop) {
  const SamplingParams p{.max_tokens = 5, .stop_token_ids = {7}, .min_tokens = 2};
  EXPECT_EQ(CheckStop(p, {2}, 2, 1), StopReason::kNone);
  EXPECT_EQ(CheckStop(p, {2}, 7, 1), StopReason::kNone);
  EXPECT_EQ(CheckStop(p, {2}, 2, 2), StopReason::kEos);
  EXPECT_EQ(CheckStop(p, {2}, 7, 2), StopReason::kStopToken);
}

TEST(SamplingStateTest, ValidateChecksTheNewParameters) {
  for (const auto& [params, field] : std::vector<std::pair<SamplingParams, const char*>>{
           {{.min_p = 1.5f}, "min_p"},
           {{.repetition_penalty = 0.f}, "repetition_penalty"},
           {{.presence_penalty = 2.5f}, "presence_penalty"},
           {{.frequency_penalty = -3.f}, "frequency_penalty"},
           {{.max_tokens = 4, .min_tokens = 5}, "min_tokens"},
           {{.logit_bias = {{10, 1.f}}}, "logit_bias"},
           {{.logit_bias = {{1, 101.f}}}, "logit_bias"},
           {{.logit_bias = {{3, 1.f}, {3, 2.f}}}, "logit_bias"},
       }) {
    const absl::Status s = params.Validate(10);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
  }
  const SamplingParams edges{.min_p = 1.f,
                             .repetition_penalty = 2.f,
                             .presence_penalty = -2.f,
                             .frequency_penalty = 2.f,
                             .logit_bias = {{0, -100.f}, {9, 100.f}},
                             .min_tokens = 16};
  EXPECT_TRUE(edges.Validate(10).ok());
}

}  // namespace
}  // namespace duet::model
