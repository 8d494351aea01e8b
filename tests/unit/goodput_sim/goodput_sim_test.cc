// The goodput simulator's pure parts: cost arithmetic, fits, and small schedules worked out by
// hand (bench/goodput_sim).
#include <vector>

#include "bench/goodput_sim/cost_model.h"
#include "bench/goodput_sim/goodput_search.h"
#include "bench/goodput_sim/simulator.h"
#include "gtest/gtest.h"

namespace duet::goodput_sim {
namespace {

UnitCosts Costs(double pf, double pt, double df, double ds, double dc, double overhead) {
  UnitCosts c;
  c.prefill = {.fixed_ms = pf, .per_token_ms = pt};
  c.decode = {.fixed_ms = df, .per_seq_ms = ds, .per_context_token_ms = dc};
  c.step_overhead_ms = overhead;
  return c;
}

TEST(GoodputCostModelTest, StepReadsTheWeightsOnceAndPaysEveryToken) {
  const UnitCosts c = Costs(10, 1, 20, 2, 0.5, 1);
  EXPECT_DOUBLE_EQ(StepMs(c, 0, 0, 0), 0);
  EXPECT_DOUBLE_EQ(PrefillMs(c, 5), 10 + 5 + 1);
  EXPECT_DOUBLE_EQ(DecodeMs(c, 2, 10), 20 + 4 + 5 + 1);
  EXPECT_DOUBLE_EQ(StepMs(c, 5, 2, 10), 20 + 5 + 4 + 5 + 1);
  UnitCosts streaming = c;
  streaming.seq_overhead_ms = 0.25;
  EXPECT_DOUBLE_EQ(StepMs(streaming, 5, 2, 10), 20 + 5 + 4 + 5 + 1 + 2 * 0.25);
  EXPECT_DOUBLE_EQ(PrefillMs(streaming, 5), 10 + 5 + 1);
  EXPECT_DOUBLE_EQ(DecodeMs(streaming, 2, 10), 20 + 4 + 5 + 1 + 2 * 0.25);
}

TEST(GoodputCostModelTest, ScaleDividesMemoryByBandwidthAndArithmeticByCompute) {
  UnitCosts c = Costs(10, 1, 20, 2, 0.5, 1);
  c.seq_overhead_ms = 0.5;
  auto s = ScaleTo(c, {.compute = 2, .bandwidth = 4});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(s->prefill.fixed_ms, 2.5);
  EXPECT_DOUBLE_EQ(s->prefill.per_token_ms, 0.5);
  EXPECT_DOUBLE_EQ(s->decode.fixed_ms, 5);
  EXPECT_DOUBLE_EQ(s->decode.per_seq_ms, 1);
  EXPECT_DOUBLE_EQ(s->decode.per_context_token_ms, 0.125);
  EXPECT_DOUBLE_EQ(s->step_overhead_ms, 1);
  EXPECT_DOUBLE_EQ(s->seq_overhead_ms, 0.5);
  EXPECT_FALSE(ScaleTo(UnitCosts{}, {.compute = 0, .bandwidth = 1}).ok());
  EXPECT_FALSE(ScaleTo(UnitCosts{}, {.compute = 1, .bandwidth = -1}).ok());
}

TEST(GoodputCostModelTest, TransferSendsWholeBlocks) {
  const TransferCost t{
      .fixed_ms = 1, .bytes_per_s = 1e5, .kv_bytes_per_token = 100, .block_tokens = 16};
  EXPECT_DOUBLE_EQ(TransferMs(t, 17), 1 + 32.0);  // 32 tokens x 100 B at 100 kB/s
  EXPECT_DOUBLE_EQ(TransferMs(t, 16), 1 + 16.0);
}

TEST(GoodputCostModelTest, FitLineRecoversALine) {
  auto line = FitLine({1, 2, 3, 4}, {3, 5, 7, 9});
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_NEAR(line->intercept, 1, 1e-12);
  EXPECT_NEAR(line->slope, 2, 1e-12);
  EXPECT_NEAR(line->max_abs_residual, 0, 1e-12);
  auto noisy = FitLine({0, 1, 2}, {0, 2, 1});
  ASSERT_TRUE(noisy.ok());
  EXPECT_NEAR(noisy->slope, 0.5, 1e-12);
  EXPECT_NEAR(noisy->max_abs_residual, 1.0, 1e-12);  // (1, 2) against 1.0
  EXPECT_FALSE(FitLine({1}, {1}).ok());
  EXPECT_FALSE(FitLine({2, 2}, {1, 3}).ok());
  EXPECT_FALSE(FitLine({1, 2}, {1}).ok());
}

// One unit; prefill 10 ms + 1 ms a token, decode steps 10 ms.
// t=0: A (4 tokens) alone -> 14, A's first token. B (arrived at 5) joins the next step with A's
// decode: 10 + 2 -> 26, A's 2nd and B's first. Then A and B decode: -> 36, both end.
TEST(GoodputSimulatorTest, ColocatedMixesPromptChunksIntoDecodeSteps) {
  const std::vector<Request> reqs = {{.arrival_ms = 0, .prompt_tokens = 4, .output_tokens = 3},
                                     {.arrival_ms = 5, .prompt_tokens = 2, .output_tokens = 2}};
  auto out = SimulateColocated({.units = 1, .costs = Costs(10, 1, 10, 0, 0, 0)}, reqs);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_DOUBLE_EQ((*out)[0].ttft_ms, 14);
  EXPECT_DOUBLE_EQ((*out)[0].tpot_ms, (36 - 14) / 2.0);
  EXPECT_DOUBLE_EQ((*out)[1].ttft_ms, 26 - 5);
  EXPECT_DOUBLE_EQ((*out)[1].tpot_ms, 36 - 26);
  // A first-token latency delays what the client sees, not the unit.
  auto later = SimulateColocated(
      {.units = 1, .costs = Costs(10, 1, 10, 0, 0, 0), .first_token_latency_ms = 7}, reqs);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_DOUBLE_EQ((*later)[1].ttft_ms, 26 - 5 + 7);
  EXPECT_DOUBLE_EQ((*later)[1].tpot_ms, 36 - 26);
}

// A prompt longer than the budget goes in chunks: 6 tokens under a budget of 4 -> passes of 4
// (14 ms) and 2 (12 ms); its first token at 26.
TEST(GoodputSimulatorTest, ColocatedChunksALongPrompt) {
  const std::vector<Request> reqs = {{.arrival_ms = 0, .prompt_tokens = 6, .output_tokens = 1}};
  auto out = SimulateColocated({.units = 1,
                                .costs = Costs(10, 1, 10, 0, 0, 0),
                                .limits = {.max_batch_tokens = 4, .max_running = 2}},
                               reqs);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_DOUBLE_EQ((*out)[0].ttft_ms, 26);
  EXPECT_DOUBLE_EQ((*out)[0].tpot_ms, 0);
}

// 1P1D; prefill 10 ms + 1 ms a token, decode 5 ms + 1 ms a sequence, transfer 3 ms.
// P: A (4) 0 -> 14, lands at 17; B (1, arrived at 2) 14 -> 25, lands at 28.
// D: A's steps 17 -> 23 -> 29 (A ends). B landed at 28, mid-step: it joins at 29 -> 35.
TEST(GoodputSimulatorTest, DisaggAdmitsLandedKvAtTheNextDecodeStep) {
  const std::vector<Request> reqs = {{.arrival_ms = 0, .prompt_tokens = 4, .output_tokens = 3},
                                     {.arrival_ms = 2, .prompt_tokens = 1, .output_tokens = 2}};
  const UnitCosts c = Costs(10, 1, 5, 1, 0, 0);
  auto out =
      SimulateDisagg({.prefill_units = 1,
                      .decode_units = 1,
                      .prefill_costs = c,
                      .decode_costs = c,
                      .transfer = {.fixed_ms = 3, .bytes_per_s = 1, .kv_bytes_per_token = 0}},
                     reqs);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_DOUBLE_EQ((*out)[0].ttft_ms, 14);
  EXPECT_DOUBLE_EQ((*out)[0].tpot_ms, (29 - 14) / 2.0);
  EXPECT_DOUBLE_EQ((*out)[1].ttft_ms, 25 - 2);
  EXPECT_DOUBLE_EQ((*out)[1].tpot_ms, 35 - 25);
}

// Two prefill units take one prompt each at once; one decode unit batches both.
TEST(GoodputSimulatorTest, DisaggSpreadsPromptsOverPrefillUnits) {
  const std::vector<Request> reqs = {{.arrival_ms = 0, .prompt_tokens = 4, .output_tokens = 2},
                                     {.arrival_ms = 0, .prompt_tokens = 4, .output_tokens = 2}};
  const UnitCosts c = Costs(10, 1, 5, 1, 0, 0);
  auto out =
      SimulateDisagg({.prefill_units = 2,
                      .decode_units = 1,
                      .prefill_costs = c,
                      .decode_costs = c,
                      .transfer = {.fixed_ms = 0, .bytes_per_s = 1, .kv_bytes_per_token = 0}},
                     reqs);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_DOUBLE_EQ((*out)[0].ttft_ms, 14);
  EXPECT_DOUBLE_EQ((*out)[1].ttft_ms, 14);
  EXPECT_DOUBLE_EQ((*out)[0].tpot_ms, 7);  // one step of both: 5 + 2
  EXPECT_DOUBLE_EQ((*out)[1].tpot_ms, 7);
}

TEST(GoodputSimulatorTest, RefusesWhatItDoesNotModel) {
  const std::vector<Request> ok = {{.arrival_ms = 0, .prompt_tokens = 1, .output_tokens = 1}};
  EXPECT_FALSE(SimulateColocated({.units = 0}, ok).ok());
  EXPECT_FALSE(SimulateDisagg({.prefill_units = 1, .decode_units = 0}, ok).ok());
  EXPECT_FALSE(SimulateDisagg({.transfer = {.bytes_per_s = 0}}, ok).ok());
  EXPECT_FALSE(SimulateColocated({.first_token_latency_ms = -1}, ok).ok());
  EXPECT_FALSE(SimulateDisagg({.first_token_latency_ms = -1}, ok).ok());
  EXPECT_FALSE(SimulateColocated({}, {{.prompt_tokens = 0}}).ok());
  EXPECT_FALSE(SimulateColocated({.limits = {.max_batch_tokens = 4, .max_running = 8}}, ok).ok());
}

TEST(GoodputSimulatorTest, JudgeCountsEachTargetAndBoth) {
  const Attainment a = Judge({{10, 5}, {400, 5}, {10, 200}, {400, 200}}, {300, 100});
  EXPECT_DOUBLE_EQ(a.both, 0.25);
  EXPECT_DOUBLE_EQ(a.ttft, 0.5);
  EXPECT_DOUBLE_EQ(a.tpot, 0.5);
  EXPECT_DOUBLE_EQ(Judge({}, {1, 1}).both, 1);
}

TEST(GoodputWorkloadTest, SameSeedScalesArrivalsWithTheRate) {
  WorkloadSpec w{.rate_per_s = 2, .duration_s = 100, .input = {32, 64}, .output = {8, 8}};
  auto slow = MakePoissonWorkload(w);
  w.rate_per_s = 4;
  auto fast = MakePoissonWorkload(w);
  ASSERT_TRUE(slow.ok() && fast.ok());
  ASSERT_GT(slow->size(), 150u);
  ASSERT_LT(slow->size(), 250u);
  ASSERT_GE(fast->size(), slow->size());
  for (size_t i = 0; i < slow->size(); ++i) {
    EXPECT_NEAR((*fast)[i].arrival_ms, (*slow)[i].arrival_ms / 2, 1e-6);
    EXPECT_EQ((*fast)[i].prompt_tokens, (*slow)[i].prompt_tokens);
    EXPECT_GE((*slow)[i].prompt_tokens, 32);
    EXPECT_LE((*slow)[i].prompt_tokens, 64);
    EXPECT_EQ((*slow)[i].output_tokens, 8);
  }
  EXPECT_FALSE(MakePoissonWorkload({.rate_per_s = 0}).ok());
  EXPECT_FALSE(MakePoissonWorkload({.input = {5, 4}}).ok());
}

// The goodput found meets the target and a rate just above it does not.
TEST(GoodputSearchTest, FindsTheKneeWithinTheResolution) {
  const UnitCosts c = Costs(10, 1, 10, 1, 0, 0);
  const Simulator sim = [&](const std::vector<Request>& r) {
    return SimulateColocated({.units = 1, .costs = c}, r);
  };
  const GoodputSearch g{.workload = {.duration_s = 200, .input = {32, 64}, .output = {16, 16}},
                        .slo = {.ttft_ms = 200, .tpot_ms = 40},
                        .relative_resolution = 0.01};
  auto rate = FindGoodput(sim, g);
  ASSERT_TRUE(rate.ok()) << rate.status();
  ASSERT_GT(*rate, 0);
  auto at = AttainmentAt(sim, g, *rate);
  auto above = AttainmentAt(sim, g, *rate * 1.02);
  ASSERT_TRUE(at.ok() && above.ok());
  EXPECT_GE(at->both, 0.9);
  EXPECT_LT(above->both, 0.9);
}

// A placement that misses the targets at any load has no goodput, even though a rate so low
// that no request arrives "meets" them.
TEST(GoodputSearchTest, NeverMeetingIsZeroNotAnEmptyRun) {
  const Simulator always_late =
      [](const std::vector<Request>& r) -> absl::StatusOr<std::vector<Outcome>> {
    return std::vector<Outcome>(r.size(), Outcome{.ttft_ms = 1e9, .tpot_ms = 0});
  };
  const GoodputSearch g{.workload = {.duration_s = 60, .input = {8, 8}, .output = {2, 2}},
                        .slo = {.ttft_ms = 100, .tpot_ms = 100}};
  auto rate = FindGoodput(always_late, g);
  ASSERT_TRUE(rate.ok()) << rate.status();
  EXPECT_EQ(*rate, 0);
}

TEST(GoodputSearchTest, PlacementsAreColocatedThenEverySplit) {
  const UnitCosts c = Costs(10, 1, 10, 1, 0, 0);
  const GoodputSearch g{.workload = {.duration_s = 60, .input = {32, 64}, .output = {16, 16}},
                        .slo = {.ttft_ms = 200, .tpot_ms = 40},
                        .relative_resolution = 0.05};
  auto p = SearchPlacements(3, {.costs = c}, {.prefill_costs = c, .decode_costs = c}, g);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->size(), 3u);
  EXPECT_EQ((*p)[0].prefill_units, 0);
  EXPECT_EQ((*p)[1].prefill_units, 1);
  EXPECT_EQ((*p)[1].decode_units, 2);
  EXPECT_EQ((*p)[2].prefill_units, 2);
  for (const Placement& x : *p) EXPECT_GT(x.goodput, 0);
  EXPECT_FALSE(SearchPlacements(1, {.costs = c}, {.prefill_costs = c, .decode_costs = c}, g).ok());
}

}  // namespace
}  // namespace duet::goodput_sim
