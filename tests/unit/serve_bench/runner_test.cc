#include "bench/serve_bench/runner.h"

#include <gtest/gtest.h>

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"

namespace duet::bench {
namespace {

// Streams max_tokens tokens, `token_ms` apart; background requests stream until cancelled.
// Fails every request whose prompt starts with id 0. Tracks the most requests in flight.
// With wait_for_background > 0, a main request starts streaming only once that many
// background requests have streamed a token (bounded wait), so tests about overlap do not
// depend on thread scheduling.
class FakeClient : public Client {
 public:
  explicit FakeClient(int token_ms, int wait_for_background = 0)
      : token_ms_(token_ms), wait_for_background_(wait_for_background) {}
  RequestRecord Send(const RequestSpec& spec, absl::Duration timeout, CancelScope* scope) override {
    RequestRecord r;
    r.cls = spec.cls;
    r.max_tokens = spec.max_tokens;
    r.requested_prompt_tokens = static_cast<int>(spec.token_ids.size());
    absl::Notification cancelled;
    int64_t key = -1;
    if (scope != nullptr) {
      key = scope->Add([&] {
        if (!cancelled.HasBeenNotified()) cancelled.Notify();
      });
      if (key < 0) {
        r.cut_at_end = true;
        return r;
      }
    }
    const int now = ++inflight_;
    int prev = max_inflight_.load();
    while (now > prev && !max_inflight_.compare_exchange_weak(prev, now)) {
    }
    ++sent_;
    r.send_ns = MonotonicNanos();
    const bool background = spec.cls == "background";
    if (!background && wait_for_background_ > 0) {
      const int64_t deadline = MonotonicNanos() + 5'000'000'000;
      while (background_streaming_.load() < wait_for_background_ && MonotonicNanos() < deadline) {
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
    const int n = background ? 1000000 : spec.max_tokens;
    for (int i = 0; i < n; ++i) {
      if (cancelled.WaitForNotificationWithTimeout(absl::Milliseconds(token_ms_))) {
        r.cut_at_end = true;
        r.status = absl::CancelledError("cut");
        break;
      }
      r.token_ns.push_back(MonotonicNanos());
      if (background && i == 0) ++background_streaming_;
    }
    r.end_ns = MonotonicNanos();
    if (!spec.token_ids.empty() && spec.token_ids[0] == 0) r.status = absl::InternalError("bad");
    --inflight_;
    if (scope != nullptr) scope->Remove(key);
    return r;
  }
  absl::Status WaitReady(absl::Duration) override { return absl::OkStatus(); }

  std::atomic<int> sent_{0};
  std::atomic<int> inflight_{0};
  std::atomic<int> max_inflight_{0};
  std::atomic<int> background_streaming_{0};

 private:
  const int token_ms_;
  const int wait_for_background_;
};

SyntheticOptions Short() { return {.input = {4, 4}, .output = {3, 3}, .min_token_id = 1}; }

TEST(RunnerTest, ClosedLoopKeepsConcurrencyAndSendsExactlyN) {
  FakeClient client(2);
  SyntheticSource main(Short(), 1, "main"), warmup(Short(), 2, "warmup");
  const RunResult r = RunBenchmark(
      client, {.concurrency = 3, .num_requests = 10, .warmup_requests = 2}, main, nullptr, &warmup);
  EXPECT_EQ(client.sent_, 12);  // 2 warm-up + 10
  ASSERT_EQ(r.records.size(), 10u);
  for (const RequestRecord& rec : r.records) {
    EXPECT_EQ(rec.cls, "main");
    EXPECT_TRUE(rec.ok());
    EXPECT_EQ(rec.output_tokens(), 3);
  }
  EXPECT_EQ(client.max_inflight_, 3);
  EXPECT_GT(r.DurationS(), 0);
}

TEST(RunnerTest, OpenLoopFollowsTheRate) {
  FakeClient client(1);
  SyntheticSource main(Short(), 1, "main");
  const int64_t t0 = MonotonicNanos();
  const RunResult r = RunBenchmark(client, {.request_rate = 100, .num_requests = 30, .seed = 5},
                                   main, nullptr, nullptr);
  const double elapsed = (MonotonicNanos() - t0) / 1e9;
  ASSERT_EQ(r.records.size(), 30u);
  // 30 arrivals at 100/s: the seeded schedule ends where PoissonArrivals says.
  PoissonArrivals a(100, 5);
  double last = 0;
  for (int i = 0; i < 30; ++i) last = a.Next();
  EXPECT_GE(elapsed, last);
  EXPECT_LT(elapsed, last + 2.0);
  for (const RequestRecord& rec : r.records) EXPECT_LT(rec.schedule_lag_ms, 500);
}

TEST(RunnerTest, DurationStopsIssuing) {
  FakeClient client(5);
  SyntheticSource main(Short(), 1, "main");
  const RunResult r =
      RunBenchmark(client, {.concurrency = 1, .duration_s = 0.2}, main, nullptr, nullptr);
  // Each request takes ~15 ms: about 13 fit in 0.2 s.
  EXPECT_GT(r.records.size(), 3u);
  EXPECT_LT(r.records.size(), 30u);
}

TEST(RunnerTest, BackgroundRunsAlongsideAndIsCutAtTheEnd) {
  FakeClient client(2, /*wait_for_background=*/2);
  SyntheticSource main(Short(), 1, "main"), bg(Short(), 3, "background");
  const int64_t t0 = MonotonicNanos();
  const RunResult r =
      RunBenchmark(client, {.concurrency = 1, .num_requests = 5, .background_concurrency = 2}, main,
                   &bg, nullptr);
  EXPECT_LT((MonotonicNanos() - t0) / 1e9, 5.0);  // background streams are endless: cut
  int main_n = 0, cut = 0;
  for (const RequestRecord& rec : r.records) {
    if (rec.cls == "main") ++main_n;
    if (rec.cls == "background") {
      EXPECT_TRUE(rec.cut_at_end);
      EXPECT_FALSE(rec.token_ns.empty());
      ++cut;
    }
  }
  EXPECT_EQ(main_n, 5);
  EXPECT_EQ(cut, 2);
  EXPECT_EQ(client.max_inflight_, 3);
}

TEST(RunnerTest, FailuresAreRecordedNotDropped) {
  FakeClient client(1);
  // Ids drawn from [0, 0]: every prompt starts with 0, so every request fails.
  SyntheticSource main({.input = {2, 2}, .output = {2, 2}, .min_token_id = 0, .max_token_id = 0}, 1,
                       "main");
  SyntheticSource warmup({.input = {2, 2}, .output = {2, 2}, .min_token_id = 0, .max_token_id = 0},
                         1, "warmup");
  const RunResult r = RunBenchmark(
      client, {.concurrency = 2, .num_requests = 4, .warmup_requests = 1}, main, nullptr, &warmup);
  EXPECT_EQ(r.warmup_failures, 1);
  ASSERT_EQ(r.records.size(), 4u);
  for (const RequestRecord& rec : r.records) EXPECT_FALSE(rec.ok());
}

}  // namespace
}  // namespace duet::bench
