#include "bench/serve_bench/stats.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace duet::bench {
namespace {

TEST(PercentileTest, InterpolatesBetweenClosestRanks) {
  const std::vector<double> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 10);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 5.5);
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 9.1);     // rank 8.1
  EXPECT_NEAR(Percentile(v, 99), 9.91, 1e-12);  // rank 8.91
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
  EXPECT_DOUBLE_EQ(Percentile(v, 150), 10);  // clamped
}

TEST(SummarizeTest, SortsAndSummarises) {
  const Summary s = Summarize({10, 1, 4, 3, 2});
  EXPECT_EQ(s.count, 5);
  EXPECT_DOUBLE_EQ(s.mean, 4);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 10);
  EXPECT_DOUBLE_EQ(s.p50, 3);
  EXPECT_DOUBLE_EQ(s.p90, 4 + 0.6 * 6);  // rank 3.6 between 4 and 10
  EXPECT_DOUBLE_EQ(s.p99, 4 + 0.96 * 6);
  const Summary e = Summarize({});
  EXPECT_EQ(e.count, 0);
  EXPECT_DOUBLE_EQ(e.p99, 0);
}

TEST(SloTest, EachLimitIsCheckedOnlyWhenSet) {
  const Slo none;
  EXPECT_TRUE(MeetsSlo(none, 1e9, 1e9, true, 1e9));
  const Slo slo{.ttft_ms = 100, .tpot_ms = 20};
  EXPECT_TRUE(MeetsSlo(slo, 100, 20, true, 5000));  // limits are inclusive
  EXPECT_FALSE(MeetsSlo(slo, 100.1, 10, true, 0));
  EXPECT_FALSE(MeetsSlo(slo, 50, 20.5, true, 0));
  EXPECT_TRUE(MeetsSlo(slo, 50, 999, false, 0));  // one token: no TPOT to check
  EXPECT_FALSE(MeetsSlo({.e2e_ms = 10}, 1, 1, true, 11));
}

TEST(SloTest, FlagsRefuseBadValuesNamingTheFlag) {
  EXPECT_TRUE(CheckSloFlags({}, {}).ok());  // no limits given; attainment 0.9
  EXPECT_TRUE(CheckSloFlags({.ttft_ms = 200, .tpot_ms = 50, .attainment = 1},
                            {"slo_ttft_ms", "slo_tpot_ms", "slo_attainment"})
                  .ok());
  absl::Status st = CheckSloFlags({.ttft_ms = 0}, {"slo_ttft_ms"});  // given as 0
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "--slo-ttft-ms must be > 0 (got 0)");
  st = CheckSloFlags({.tpot_ms = -5}, {"slo_tpot_ms"});
  EXPECT_EQ(st.message(), "--slo-tpot-ms must be > 0 (got -5)");
  st = CheckSloFlags({.e2e_ms = -1}, {});
  EXPECT_EQ(st.message(), "--slo-e2e-ms must be > 0 (got -1)");
  for (double bad : {0.0, -0.5, 1.01}) {
    st = CheckSloFlags({.ttft_ms = 100, .attainment = bad}, {"slo_ttft_ms", "slo_attainment"});
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StartsWith(st.message(), "--slo-attainment must be in (0, 1]")) << st;
  }
}

}  // namespace
}  // namespace duet::bench
