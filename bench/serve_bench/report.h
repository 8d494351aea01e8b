// Turns a run's request records into the benchmark report: per workload class ("main",
// "background", and "all") the TTFT, TPOT, inter-token latency, end-to-end time and the
// first-to-second-token gap (p50/p90/p99/mean), the server-side breakdown of the time to the
// second token, request and token throughput, goodput under SLOs, every error counted, and the
// prefix cache's hit rates and KV bytes sent (by turn for multi_turn; cache_report.h).
// Requests cut at the end of the run count in no throughput, but the tokens they streamed count
// in the TTFT, gap, TPOT and ITL statistics.
//
//   ReportOptions ro{.slo = {.ttft_ms = 2000, .tpot_ms = 100}};
//   nlohmann::json j = BuildReport(result, ro);
//   std::cout << FormatTable(j);
#pragma once

#include <string>
#include <vector>

#include "bench/serve_bench/request_record.h"
#include "bench/serve_bench/runner.h"
#include "bench/serve_bench/stats.h"
#include "nlohmann/json.hpp"

namespace duet::bench {

struct ReportOptions {
  Slo slo;
  bool per_request = false;  // include one JSON object per request
};

// The report of one class of requests over a run of `duration_s`.
nlohmann::json SummarizeClass(const std::vector<const RequestRecord*>& records, double duration_s,
                              const ReportOptions& options);

// {"duration_s", "classes": {"all", "main", ["background"]}, ["requests"]}.
nlohmann::json BuildReport(const RunResult& result, const ReportOptions& options);

// A human-readable table of a BuildReport() result.
std::string FormatTable(const nlohmann::json& report);

nlohmann::json SummaryJson(const Summary& s);

}  // namespace duet::bench
