#include "bench/serve_bench/cache_report.h"

#include <gtest/gtest.h>

#include "bench/serve_bench/report.h"

namespace duet::bench {
namespace {

RequestRecord Rec(int turn, int prompt, int p_cached, int d_cached, int64_t kv, int new_tokens) {
  RequestRecord r;
  r.cls = "main";
  r.session = turn >= 0 ? 0 : -1;
  r.turn = turn;
  r.prompt_tokens = prompt;
  r.new_tokens = new_tokens;
  r.cache = {
      .prefill_cached_tokens = p_cached, .decode_cached_tokens = d_cached, .kv_bytes_sent = kv};
  r.send_ns = 0;
  r.token_ns = {10'000'000, 13'000'000};  // TTFT 10 ms, gap 3 ms
  r.end_ns = 13'000'000;
  return r;
}

TEST(CacheReportTest, HitRatesAreCachedOverPromptTokensOnEachSide) {
  std::vector<RequestRecord> recs = {Rec(-1, 100, 0, 0, 1000, 0), Rec(-1, 100, 80, 64, 360, 0),
                                     Rec(-1, 200, 160, 160, 400, 0)};
  RequestRecord failed = Rec(-1, 1000, 1000, 1000, 0, 0);
  failed.status = absl::InternalError("x");  // not counted
  recs.push_back(failed);
  std::vector<const RequestRecord*> ptrs;
  for (const RequestRecord& r : recs) ptrs.push_back(&r);
  const nlohmann::json c = SummarizePrefixCache(ptrs);
  EXPECT_EQ(c["requests"], 3);
  EXPECT_EQ(c["prompt_tokens"], 400);
  EXPECT_EQ(c["prefill_cached_tokens"], 240);
  EXPECT_EQ(c["decode_cached_tokens"], 224);
  EXPECT_DOUBLE_EQ(c["hit_rate_prefill"].get<double>(), 0.6);
  EXPECT_DOUBLE_EQ(c["hit_rate_decode"].get<double>(), 0.56);
  EXPECT_EQ(c["kv_bytes_sent_total"], 1760);
  EXPECT_DOUBLE_EQ(c["kv_bytes_sent"]["p50"].get<double>(), 400);
  EXPECT_TRUE(SummarizeByTurn(ptrs).empty());
}

TEST(CacheReportTest, UnreportedSidesGiveNullNotZero) {
  RequestRecord http = Rec(-1, 100, 32, -1, -1, 0);  // the HTTP API: prefill side only
  const nlohmann::json c = SummarizePrefixCache({&http});
  EXPECT_DOUBLE_EQ(c["hit_rate_prefill"].get<double>(), 0.32);
  EXPECT_TRUE(c["hit_rate_decode"].is_null());
  EXPECT_EQ(c["kv_bytes_sent"]["count"], 0);
  EXPECT_NE(FormatPrefixCache(c, nlohmann::json::array()).find("D      -"), std::string::npos);
}

TEST(CacheReportTest, ByTurnAggregatesEachTurnIndexAndTheReportCarriesIt) {
  RunResult run;
  run.records = {Rec(0, 50, 0, 0, 5000, 50), Rec(0, 70, 0, 0, 7000, 70),
                 Rec(1, 120, 48, 112, 800, 40), Rec(1, 140, 64, 128, 1200, 60),
                 Rec(2, 200, 112, 192, 800, 30)};
  run.start_ns = 0;
  run.end_ns = 1'000'000'000;
  const nlohmann::json j = BuildReport(run, {});
  const nlohmann::json& t = j["classes"]["main"]["by_turn"];
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0]["turn"], 0);
  EXPECT_EQ(t[0]["requests"], 2);
  EXPECT_DOUBLE_EQ(t[0]["hit_rate_prefill"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(t[0]["kv_bytes_sent"]["mean"].get<double>(), 6000);
  EXPECT_EQ(t[1]["requests"], 2);
  EXPECT_DOUBLE_EQ(t[1]["prompt_tokens_mean"].get<double>(), 130);
  EXPECT_DOUBLE_EQ(t[1]["new_tokens_mean"].get<double>(), 50);
  EXPECT_DOUBLE_EQ(t[1]["hit_rate_prefill"].get<double>(), 112.0 / 260);
  EXPECT_DOUBLE_EQ(t[1]["hit_rate_decode"].get<double>(), 240.0 / 260);
  EXPECT_DOUBLE_EQ(t[2]["kv_bytes_sent"]["p50"].get<double>(), 800);
  EXPECT_DOUBLE_EQ(t[2]["ttft_ms"]["p50"].get<double>(), 10);
  EXPECT_DOUBLE_EQ(t[2]["first_to_second_gap_ms"]["p50"].get<double>(), 3);
  const nlohmann::json& c = j["classes"]["main"]["prefix_cache"];
  EXPECT_EQ(c["prompt_tokens"], 580);
  EXPECT_EQ(c["new_tokens"], 250);
  const std::string table = FormatTable(j);
  EXPECT_NE(table.find("prefix cache: 580 prompt tokens"), std::string::npos) << table;
  EXPECT_NE(table.find("KV bytes p50"), std::string::npos) << table;
}

}  // namespace
}  // namespace duet::bench
