#include "common/metrics/metrics.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "common/kv/pool_gauges.h"
#include "common/metrics/outcome.h"

namespace duet::metrics {
namespace {

bool Contains(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(MetricsTest, OutcomeLabels) {
  EXPECT_EQ(OutcomeLabel(absl::OkStatus()), "ok");
  EXPECT_EQ(OutcomeLabel(absl::CancelledError("gone")), "cancelled");
  EXPECT_EQ(OutcomeLabel(absl::ResourceExhaustedError("full")), "resource_exhausted");
  EXPECT_EQ(OutcomeLabel(absl::DeadlineExceededError("slow")), "deadline_exceeded");
}

TEST(MetricsTest, BlockPoolGaugeIsReadAtEachScrape) {
  Registry reg;
  kv::BlockPoolStats stats{.total = 10, .free = 7, .used = 2, .quarantined = 1};
  kv::AddBlockPoolGauge(&reg, "duet_x_kv_blocks", "pool", [&] { return stats; });
  std::string text = reg.Render();
  EXPECT_TRUE(Contains(text, "# TYPE duet_x_kv_blocks gauge")) << text;
  EXPECT_TRUE(Contains(text, "duet_x_kv_blocks{state=\"free\"} 7")) << text;
  EXPECT_TRUE(Contains(text, "duet_x_kv_blocks{state=\"used\"} 2")) << text;
  EXPECT_TRUE(Contains(text, "duet_x_kv_blocks{state=\"quarantined\"} 1")) << text;
  EXPECT_TRUE(Contains(text, "duet_x_kv_blocks{state=\"total\"} 10")) << text;
  stats.free = 3;
  text = reg.Render();
  EXPECT_TRUE(Contains(text, "duet_x_kv_blocks{state=\"free\"} 3")) << text;
}

TEST(MetricsTest, CounterAndGaugeRenderWithLabels) {
  Registry reg;
  auto& requests = reg.AddCounter("duet_requests_total", "Requests by outcome", {"outcome"});
  requests.WithLabels({"ok"}).Increment();
  requests.WithLabels({"ok"}).Increment(2);
  requests.WithLabels({"cancelled"}).Increment();
  reg.AddGauge("duet_queue_depth", "Requests waiting", {}).WithLabels({}).Set(4.5);
  const std::string text = reg.Render();
  EXPECT_TRUE(Contains(text, "# HELP duet_requests_total Requests by outcome")) << text;
  EXPECT_TRUE(Contains(text, "# TYPE duet_requests_total counter")) << text;
  EXPECT_TRUE(Contains(text, "duet_requests_total{outcome=\"ok\"} 3")) << text;
  EXPECT_TRUE(Contains(text, "duet_requests_total{outcome=\"cancelled\"} 1")) << text;
  EXPECT_TRUE(Contains(text, "# TYPE duet_queue_depth gauge")) << text;
  EXPECT_TRUE(Contains(text, "duet_queue_depth 4.5")) << text;
}

TEST(MetricsTest, SameNameReturnsSameFamily) {
  Registry reg;
  reg.AddCounter("c_total", "h", {"a"}).WithLabels({"x"}).Increment();
  reg.AddCounter("c_total", "h", {"a"}).WithLabels({"x"}).Increment();
  EXPECT_EQ(reg.AddCounter("c_total", "h", {"a"}).WithLabels({"x"}).value(), 2);
}

TEST(MetricsTest, HistogramBucketsAreCumulativeWithInf) {
  Registry reg;
  Histogram& h =
      reg.AddHistogram("lat_seconds", "Latency", {"node"}, {0.1, 1.0}).WithLabels({"d0"});
  h.Observe(0.05);
  h.Observe(0.1);  // on the bound: le is inclusive
  h.Observe(0.5);
  h.Observe(7);
  const std::string text = reg.Render();
  EXPECT_TRUE(Contains(text, "# TYPE lat_seconds histogram")) << text;
  EXPECT_TRUE(Contains(text, "lat_seconds_bucket{node=\"d0\",le=\"0.10000000000000001\"} 2") ||
              Contains(text, "lat_seconds_bucket{node=\"d0\",le=\"0.1\"} 2"))
      << text;
  EXPECT_TRUE(Contains(text, "lat_seconds_bucket{node=\"d0\",le=\"1\"} 3")) << text;
  EXPECT_TRUE(Contains(text, "lat_seconds_bucket{node=\"d0\",le=\"+Inf\"} 4")) << text;
  EXPECT_TRUE(Contains(text, "lat_seconds_count{node=\"d0\"} 4")) << text;
  EXPECT_TRUE(Contains(text, "lat_seconds_sum{node=\"d0\"} 7.6500000000000004") ||
              Contains(text, "lat_seconds_sum{node=\"d0\"} 7.65"))
      << text;
}

TEST(MetricsTest, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  Registry reg;
  reg.AddGauge("g", "line one\nline \\two", {"path"}).WithLabels({"/v1/\"x\""}).Set(1);
  const std::string text = reg.Render();
  EXPECT_TRUE(Contains(text, "# HELP g line one\\nline \\\\two")) << text;
  EXPECT_TRUE(Contains(text, "g{path=\"/v1/\\\"x\\\"\"} 1")) << text;
}

TEST(MetricsTest, FormatsSpecialValues) {
  EXPECT_EQ(FormatValue(3), "3");
  EXPECT_EQ(FormatValue(-2), "-2");
  EXPECT_EQ(FormatValue(0.25), "0.25");
  // The shortest decimal that reads back as the same double, as Prometheus clients print.
  EXPECT_EQ(FormatValue(0.0025), "0.0025");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(std::stod(FormatValue(1.0 / 3)), 1.0 / 3);
  EXPECT_EQ(FormatValue(2.5e-7), "2.5e-07");
  EXPECT_EQ(FormatValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(FormatValue(0.0 / 0.0), "NaN");
}

TEST(MetricsTest, CallbackGaugeIsReadAtRender) {
  Registry reg;
  int free_blocks = 10;
  reg.AddGaugeCallback("kv_blocks", "KV blocks", {"state"}, [&] {
    return std::vector<Sample>{{{"free"}, static_cast<double>(free_blocks)}, {{"used"}, 2}};
  });
  EXPECT_TRUE(Contains(reg.Render(), "kv_blocks{state=\"free\"} 10"));
  free_blocks = 7;
  EXPECT_TRUE(Contains(reg.Render(), "kv_blocks{state=\"free\"} 7"));
  EXPECT_TRUE(Contains(reg.Render(), "kv_blocks{state=\"used\"} 2"));
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  Registry reg;
  Counter& c = reg.AddCounter("n_total", "n", {}).WithLabels({});
  Histogram& h = reg.AddHistogram("h", "h", {}, {1}).WithLabels({});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.Increment();
        h.Observe(0.5);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.value(), 40000);
  EXPECT_EQ(h.count(), 40000u);
  EXPECT_EQ(h.BucketCounts()[0], 40000u);
}

}  // namespace
}  // namespace duet::metrics
