// Drives one benchmark run: a sequential warm-up, then the measured requests at a fixed
// concurrency (closed loop) or at Poisson arrivals of a given rate (open loop, one thread per
// request in flight), optionally with background requests kept running alongside (closed loop,
// for "long prompts against running decodes"). Background requests still running when the
// measured ones are done are cancelled and marked cut_at_end.
//
//   RunOptions o{.request_rate = 2.0, .num_requests = 100, .warmup_requests = 2, .seed = 1};
//   RunResult r = RunBenchmark(*client, o, main_source, background_source.get(), warmup_source);
//
// RunSessions drives a multi-turn chat workload instead: --concurrency threads each take the
// next ready session's turn, send it, and hand its generated ids back (prefix_workloads.h).
//
//   MultiTurnWorkload chats(mt_options, seed, "main");
//   RunResult r = RunSessions(*client, o, chats, warmup_source);
#pragma once

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "bench/serve_bench/client.h"
#include "bench/serve_bench/prefix_workloads.h"
#include "bench/serve_bench/request_record.h"
#include "bench/serve_bench/workload.h"

namespace duet::bench {

struct RunOptions {
  double request_rate = 0;  // > 0: Poisson arrivals per second; 0: closed loop
  int concurrency = 1;      // closed loop: requests in flight
  int max_concurrency = 0;  // open loop: cap on requests in flight (0: none); arrivals wait
  int num_requests = 0;     // measured requests (0: until duration_s)
  double duration_s = 0;    // stop issuing after this long (0: until num_requests)
  int warmup_requests = 0;  // sent one at a time before the measured run, not reported
  int background_concurrency = 0;
  uint64_t seed = 0;  // arrivals
  absl::Duration request_timeout = absl::Minutes(5);
};

struct RunResult {
  std::vector<RequestRecord> records;  // measured and background requests, in completion order
  int64_t start_ns = 0;                // first measured send was scheduled
  int64_t end_ns = 0;                  // last measured request finished
  int warmup_failures = 0;
  int abandoned_turns = 0;  // multi_turn: turns never sent because an earlier one failed
  double DurationS() const { return (end_ns - start_ns) / 1e9; }
};

RunResult RunBenchmark(Client& client, const RunOptions& options, RequestSource& main,
                       RequestSource* background, RequestSource* warmup);

// Closed loop over chat sessions: options.concurrency turns in flight at most (fewer when fewer
// sessions are ready), each session's turns one after another; stops issuing after
// options.duration_s (> 0). options.request_rate and num_requests are not used.
RunResult RunSessions(Client& client, const RunOptions& options, MultiTurnWorkload& sessions,
                      RequestSource* warmup);

}  // namespace duet::bench
