#include "bench/serve_bench/runner.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/base/clock.h"

namespace duet::bench {
namespace {

void SleepUntilNs(int64_t t_ns) {
  const int64_t now = MonotonicNanos();
  if (t_ns > now) absl::SleepFor(absl::Nanoseconds(t_ns - now));
}

// Collects records from many threads.
class Sink {
 public:
  void Add(RequestRecord r) {
    absl::MutexLock lock(&mu_);
    records_.push_back(std::move(r));
  }
  std::vector<RequestRecord> Take() {
    absl::MutexLock lock(&mu_);
    return std::move(records_);
  }

 private:
  absl::Mutex mu_;
  std::vector<RequestRecord> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

RunResult RunBenchmark(Client& client, const RunOptions& options, RequestSource& main,
                       RequestSource* background, RequestSource* warmup) {
  RunResult result;
  for (int i = 0; i < options.warmup_requests && warmup != nullptr; ++i) {
    if (!client.Send(warmup->Next(), options.request_timeout, nullptr).ok()) {
      ++result.warmup_failures;
    }
  }

  Sink sink;
  CancelScope background_scope;
  std::vector<std::thread> background_threads;
  if (background != nullptr) {
    for (int i = 0; i < options.background_concurrency; ++i) {
      background_threads.emplace_back([&] {
        while (!background_scope.cancelled()) {
          RequestRecord r =
              client.Send(background->Next(), options.request_timeout, &background_scope);
          const bool failed = !r.ok() && !r.cut_at_end;
          if (!(r.cut_at_end && r.token_ns.empty() && r.send_ns == 0)) sink.Add(std::move(r));
          // A failing endpoint must not turn the background into a busy loop of errors.
          if (failed) absl::SleepFor(absl::Milliseconds(100));
        }
      });
    }
  }

  const int64_t start = MonotonicNanos();
  const int64_t stop_issuing =
      options.duration_s > 0 ? start + static_cast<int64_t>(options.duration_s * 1e9) : INT64_MAX;
  const int limit = options.num_requests > 0 ? options.num_requests : INT32_MAX;
  result.start_ns = start;
  std::atomic<int64_t> last_end{start};
  auto note_end = [&](int64_t t) {
    int64_t prev = last_end.load();
    while (t > prev && !last_end.compare_exchange_weak(prev, t)) {
    }
  };

  if (options.request_rate > 0) {
    // Open loop: each arrival gets its own thread at its scheduled time.
    PoissonArrivals arrivals(options.request_rate, options.seed);
    std::vector<std::thread> threads;
    struct Gate {
      int inflight = 0;
      int cap = 0;
      static bool HasRoom(Gate* g) { return g->cap <= 0 || g->inflight < g->cap; }
    } gate{0, options.max_concurrency};
    absl::Mutex gate_mu;
    for (int i = 0; i < limit; ++i) {
      const int64_t at = start + static_cast<int64_t>(arrivals.Next() * 1e9);
      if (at > stop_issuing) break;
      SleepUntilNs(at);
      {
        absl::MutexLock lock(&gate_mu);
        gate_mu.Await(absl::Condition(&Gate::HasRoom, &gate));
        ++gate.inflight;
      }
      RequestSpec spec = main.Next();
      threads.emplace_back([&, spec = std::move(spec), at] {
        RequestRecord r = client.Send(spec, options.request_timeout, nullptr);
        r.schedule_lag_ms = (r.send_ns - at) / 1e6;
        note_end(r.end_ns);
        sink.Add(std::move(r));
        absl::MutexLock lock(&gate_mu);
        --gate.inflight;
      });
    }
    for (std::thread& t : threads) t.join();
  } else {
    // Closed loop: `concurrency` workers, each sending its next request when the last is done.
    std::atomic<int> issued{0};
    std::vector<std::thread> workers;
    for (int w = 0; w < std::max(1, options.concurrency); ++w) {
      workers.emplace_back([&] {
        while (issued.fetch_add(1) < limit && MonotonicNanos() < stop_issuing) {
          RequestRecord r = client.Send(main.Next(), options.request_timeout, nullptr);
          note_end(r.end_ns);
          sink.Add(std::move(r));
        }
      });
    }
    for (std::thread& t : workers) t.join();
  }
  result.end_ns = last_end.load();

  background_scope.CancelAll();
  for (std::thread& t : background_threads) t.join();
  result.records = sink.Take();
  return result;
}

RunResult RunSessions(Client& client, const RunOptions& options, MultiTurnWorkload& sessions,
                      RequestSource* warmup) {
  RunResult result;
  for (int i = 0; i < options.warmup_requests && warmup != nullptr; ++i) {
    if (!client.Send(warmup->Next(), options.request_timeout, nullptr).ok()) {
      ++result.warmup_failures;
    }
  }
  Sink sink;
  const int64_t start = MonotonicNanos();
  const int64_t stop_issuing =
      options.duration_s > 0 ? start + static_cast<int64_t>(options.duration_s * 1e9) : INT64_MAX;
  result.start_ns = start;
  std::atomic<int64_t> last_end{start};
  std::atomic<int> not_sent{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < std::max(1, options.concurrency); ++w) {
    workers.emplace_back([&] {
      while (std::optional<RequestSpec> spec = sessions.Take()) {
        if (MonotonicNanos() >= stop_issuing) {
          // Out of time: this turn is not sent, and its session ends here.
          sessions.Finish(*spec, /*ok=*/false, {});
          ++not_sent;
          continue;
        }
        RequestRecord r = client.Send(*spec, options.request_timeout, nullptr);
        sessions.Finish(*spec, r.ok(), r.output_ids);
        int64_t prev = last_end.load();
        while (r.end_ns > prev && !last_end.compare_exchange_weak(prev, r.end_ns)) {
        }
        sink.Add(std::move(r));
      }
    });
  }
  for (std::thread& t : workers) t.join();
  result.end_ns = last_end.load();
  result.abandoned_turns = sessions.abandoned_turns() + not_sent.load();
  result.records = sink.Take();
  return result;
}

}  // namespace duet::bench
