#include "bench/serve_bench/report.h"

#include <gtest/gtest.h>

namespace duet::bench {
namespace {

constexpr int64_t kMs = 1000000;

// A completed request sent at `send_ms` whose tokens arrive at the given times (ms).
RequestRecord Done(const std::string& cls, int64_t send_ms, std::vector<int64_t> token_ms,
                   int max_tokens = 0) {
  RequestRecord r;
  r.cls = cls;
  r.send_ns = send_ms * kMs;
  for (int64_t t : token_ms) r.token_ns.push_back(t * kMs);
  r.end_ns = r.token_ns.back();
  r.max_tokens = max_tokens > 0 ? max_tokens : static_cast<int>(token_ms.size());
  r.requested_prompt_tokens = 100;
  r.finish_reason = "length";
  return r;
}

TEST(RecordTest, DerivedLatencies) {
  const RequestRecord r = Done("main", 0, {100, 130, 140, 160});
  EXPECT_DOUBLE_EQ(r.TtftMs(), 100);
  EXPECT_DOUBLE_EQ(r.FirstToSecondGapMs(), 30);
  EXPECT_DOUBLE_EQ(r.TpotMs(), 20);  // (160 - 100) / 3
  EXPECT_EQ(r.ItlMs(), (std::vector<double>{30, 10, 20}));
  EXPECT_DOUBLE_EQ(r.E2eMs(), 160);
}

TEST(ReportTest, CountsGoodputThroughputAndErrors) {
  RunResult run;
  run.start_ns = 0;
  run.end_ns = 10000 * kMs;                                 // 10 s
  run.records.push_back(Done("main", 0, {100, 120, 140}));  // TTFT 100, TPOT 20: good
  run.records.push_back(Done("main", 0, {300, 310, 320}));  // TTFT 300: misses TTFT SLO
  run.records.push_back(Done("main", 0, {50, 150, 250}));   // TPOT 100: misses TPOT SLO
  run.records.push_back(Done("main", 0, {80}, /*max=*/4));  // one token (ended early): good
  RequestRecord failed;
  failed.cls = "main";
  failed.status = absl::UnavailableError("node gone");
  run.records.push_back(failed);
  failed.status = absl::UnavailableError("node gone");
  run.records.push_back(failed);
  failed.status = absl::UnavailableError("request req-17 refused: 64/64 running");
  run.records.push_back(failed);
  failed.status = absl::UnavailableError("request req-18 refused: 64/64 running");
  run.records.push_back(failed);
  RequestRecord cut = Done("background", 0, {10, 20});
  cut.cut_at_end = true;
  cut.status = absl::CancelledError("cut");
  run.records.push_back(cut);
  RequestRecord with_server = Done("background", 0, {1000, 1200});
  with_server.has_server_timings = true;
  with_server.server = {.queue_us = 5000,
                        .prefill_compute_us = 990000,
                        .transfer_tail_us = 5000,
                        .ttft_us = 1000000,
                        .last_layer_transfer_us = 3000,
                        .max_layer_transfer_us = 4000};
  run.records.push_back(with_server);

  const nlohmann::json j = BuildReport(run, {.slo = {.ttft_ms = 200, .tpot_ms = 50}});
  EXPECT_DOUBLE_EQ(j["duration_s"].get<double>(), 10);
  const auto& m = j["classes"]["main"];
  EXPECT_EQ(m["requests"]["completed"], 4);
  EXPECT_EQ(m["requests"]["failed"], 4);
  EXPECT_EQ(m["requests"]["cut_at_end"], 0);
  EXPECT_EQ(m["requests"]["short_output"], 1);
  // Errors are grouped with digits masked: two groups, each with its first message.
  ASSERT_EQ(m["errors"].size(), 2u);
  EXPECT_EQ(m["errors"][0]["count"], 2);
  EXPECT_EQ(m["errors"][0]["message"], "node gone");
  EXPECT_EQ(m["errors"][1]["count"], 2);
  EXPECT_EQ(m["errors"][1]["message"], "request req-17 refused: 64/64 running");
  EXPECT_EQ(m["errors"][1]["pattern"], "request req-# refused: #/# running");
  EXPECT_DOUBLE_EQ(m["goodput"]["requests_per_s"].get<double>(), 0.2);  // 2 good / 10 s
  EXPECT_DOUBLE_EQ(m["goodput"]["fraction"].get<double>(), 2.0 / 8.0);
  EXPECT_DOUBLE_EQ(m["throughput"]["requests_per_s"].get<double>(), 0.4);
  EXPECT_DOUBLE_EQ(m["throughput"]["output_tokens_per_s"].get<double>(), 1.0);  // 10 tokens
  EXPECT_DOUBLE_EQ(m["throughput"]["total_tokens_per_s"].get<double>(), 41.0);
  EXPECT_EQ(m["latency_ms"]["ttft"]["count"], 4);
  EXPECT_DOUBLE_EQ(m["latency_ms"]["ttft"]["max"].get<double>(), 300);
  EXPECT_EQ(m["latency_ms"]["tpot"]["count"], 3);  // the one-token request has none
  EXPECT_DOUBLE_EQ(m["latency_ms"]["first_to_second_gap"]["p50"].get<double>(), 20);
  EXPECT_EQ(m["latency_ms"]["itl"]["count"], 6);
  EXPECT_EQ(m["server_ms"]["queue"]["count"], 0);

  const auto& b = j["classes"]["background"];
  EXPECT_EQ(b["requests"]["completed"], 1);
  EXPECT_EQ(b["requests"]["cut_at_end"], 1);
  // The cut request's two tokens count in the latencies (not in throughput).
  EXPECT_EQ(b["latency_ms"]["tpot"]["count"], 2);
  EXPECT_DOUBLE_EQ(b["latency_ms"]["tpot"]["min"].get<double>(), 10);
  EXPECT_EQ(b["latency_ms"]["e2e"]["count"], 1);
  EXPECT_DOUBLE_EQ(b["throughput"]["output_tokens_per_s"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(b["server_ms"]["transfer_tail"]["mean"].get<double>(), 5);
  EXPECT_DOUBLE_EQ(b["server_ms"]["prefill_compute"]["mean"].get<double>(), 990);
  EXPECT_DOUBLE_EQ(b["transfer_tail_pct_of_ttft"]["p50"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(b["server_ms"]["last_layer_transfer"]["p50"].get<double>(), 3);
  EXPECT_DOUBLE_EQ(b["server_ms"]["slowest_layer_transfer"]["p50"].get<double>(), 4);
  EXPECT_EQ(m["server_ms"]["last_layer_transfer"]["count"], 0);  // not reported

  EXPECT_EQ(j["classes"]["all"]["requests"]["completed"], 5);
  EXPECT_EQ(j["classes"]["all"]["requests"]["failed"], 4);
  EXPECT_FALSE(j.contains("requests"));
  const std::string table = FormatTable(j);
  EXPECT_NE(table.find("[main] completed 4  failed 4"), std::string::npos) << table;
  EXPECT_NE(table.find("error x2: node gone"), std::string::npos) << table;
}

// DistServe's SLO attainment on hand-made records: TTFT and TPOT (vLLM's: (end - first token) /
// (n - 1)) limits, each alone and both; failed requests meet neither; one-token outputs are
// judged on TTFT only; requests cut at the end are not judged.
TEST(SloAttainmentTest, CountsEachLimitAndBoth) {
  const Slo slo{.ttft_ms = 200, .tpot_ms = 50, .attainment = 0.5};
  std::vector<RequestRecord> recs;
  recs.push_back(Done("main", 0, {100, 140, 180}));  // TTFT 100, TPOT 40: both
  recs.push_back(Done("main", 0, {250, 260, 270}));  // TTFT 250: TPOT only
  recs.push_back(Done("main", 0, {100, 200, 300}));  // TPOT 100: TTFT only
  recs.push_back(Done("main", 0, {300, 500}));       // neither
  recs.push_back(Done("main", 0, {150}));            // one token, TTFT 150: both (no TPOT)
  recs.push_back(Done("main", 0, {210}));            // one token, TTFT 210: TPOT only
  // The last token at 140 but the stream ends at 220: vLLM's TPOT is (220 - 100) / 2 = 60.
  RequestRecord late_end = Done("main", 0, {100, 120, 140});
  late_end.end_ns = 220 * kMs;
  recs.push_back(late_end);  // TTFT only
  RequestRecord failed;      // failed before any token
  failed.cls = "main";
  failed.status = absl::UnavailableError("node gone");
  recs.push_back(failed);
  RequestRecord failed_late = Done("main", 0, {10, 20});  // tokens, then an error: meets nothing
  failed_late.status = absl::InternalError("stream broken");
  recs.push_back(failed_late);
  RequestRecord cut = Done("main", 0, {10, 20});  // cut at the end: not judged
  cut.cut_at_end = true;
  recs.push_back(cut);
  std::vector<const RequestRecord*> ptrs;
  for (const RequestRecord& r : recs) ptrs.push_back(&r);

  EXPECT_DOUBLE_EQ(late_end.SloTpotMs(), 60);
  EXPECT_DOUBLE_EQ(late_end.TpotMs(), 20);  // the reported TPOT: last token, not end
  EXPECT_TRUE(MeetsSlo(recs[0], slo));
  EXPECT_TRUE(MeetsSlo(recs[4], slo));
  EXPECT_FALSE(MeetsSlo(recs[5], slo));
  EXPECT_FALSE(MeetsSlo(failed, slo));
  EXPECT_FALSE(MeetsSlo(failed_late, slo));
  EXPECT_FALSE(MeetsSlo(cut, slo));

  const SloAttainment a = MeasureSloAttainment(ptrs, slo);
  EXPECT_EQ(a.requests, 9);
  EXPECT_EQ(a.met_ttft, 4);  // 0, 2, 4, 6
  EXPECT_EQ(a.met_tpot, 4);  // 0, 1, 4, 5 (one token: no TPOT to miss); no failed one
  EXPECT_EQ(a.met_all, 2);   // 0, 4
  EXPECT_EQ(a.met_e2e, 7);   // no e2e limit: every completed request

  RunResult run;
  run.end_ns = 4000 * kMs;  // 4 s
  run.records = recs;
  const nlohmann::json g = BuildReport(run, {.slo = slo})["classes"]["main"]["goodput"];
  EXPECT_DOUBLE_EQ(g["slo_attainment"].get<double>(), 2.0 / 9);
  EXPECT_DOUBLE_EQ(g["fraction"].get<double>(), 2.0 / 9);
  EXPECT_DOUBLE_EQ(g["ttft_attainment"].get<double>(), 4.0 / 9);
  EXPECT_DOUBLE_EQ(g["tpot_attainment"].get<double>(), 4.0 / 9);
  EXPECT_DOUBLE_EQ(g["requests_per_s"].get<double>(), 0.5);  // 2 met both / 4 s
  EXPECT_EQ(g["requests_met"], 2);
  EXPECT_EQ(g["requests_judged"], 9);
  EXPECT_DOUBLE_EQ(g["attainment_target"].get<double>(), 0.5);
  EXPECT_FALSE(g["meets_target"].get<bool>());  // 22 % < 50 %
}

TEST(SloAttainmentTest, TargetAndTable) {
  RunResult run;
  run.end_ns = 1000 * kMs;
  for (int i = 0; i < 9; ++i) run.records.push_back(Done("main", 0, {100, 110, 120}));
  run.records.push_back(Done("main", 0, {900, 910}));  // misses TTFT
  const nlohmann::json j = BuildReport(run, {.slo = {.ttft_ms = 500, .tpot_ms = 50}});
  const auto& g = j["classes"]["main"]["goodput"];
  EXPECT_DOUBLE_EQ(g["slo_attainment"].get<double>(), 0.9);
  EXPECT_TRUE(g["meets_target"].get<bool>());  // 90 % >= the default 90 %: inclusive
  const std::string table = FormatTable(j);
  EXPECT_NE(table.find("SLO (TTFT <= 500 ms, TPOT <= 50 ms): attainment 90.0% of 10 (target "
                       "90%: met)  TTFT alone 90.0%  TPOT alone 100.0%  goodput 9.000 req/s"),
            std::string::npos)
      << table;
  // No limits: every completed request meets them, and the table has no SLO line.
  const nlohmann::json none = BuildReport(run, {});
  EXPECT_DOUBLE_EQ(none["classes"]["main"]["goodput"]["slo_attainment"].get<double>(), 1.0);
  EXPECT_EQ(FormatTable(none).find("SLO ("), std::string::npos);
  // No request ended: attainment 0, target not met.
  EXPECT_FALSE(
      BuildReport(RunResult{}, {.slo = {.ttft_ms = 1}})["classes"]["all"]["goodput"]["meets_target"]
          .get<bool>());
}

TEST(ReportTest, PerRequestRows) {
  RunResult run;
  run.end_ns = kMs;
  run.records.push_back(Done("main", 0, {10, 15}));
  const nlohmann::json j = BuildReport(run, {.per_request = true});
  ASSERT_EQ(j["requests"].size(), 1u);
  EXPECT_DOUBLE_EQ(j["requests"][0]["gap_ms"].get<double>(), 5);
  EXPECT_EQ(j["requests"][0]["output_tokens"], 2);
  EXPECT_TRUE(j["requests"][0]["slo_met"].get<bool>());  // no limits set
}

}  // namespace
}  // namespace duet::bench
