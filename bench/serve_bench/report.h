// Turns a run's request records into the benchmark report: per workload class ("main",
// "background", and "all") the TTFT, TPOT, inter-token latency, end-to-end time and the
// first-to-second-token gap (p50/p90/p99/mean), the server-side breakdown of the time to the
// second token, request and token throughput, goodput and SLO attainment (each target alone and
// together, against Slo::attainment), every error counted, and the prefix cache's hit rates and
// KV bytes sent (by turn for multi_turn; cache_report.h).
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

// DistServe's SLO attainment over the requests that ended in a run (completed or failed; those
// cut at its end are judged on neither side). A failed request meets no limit; one with a
// single output token has no TPOT and is judged on TTFT (and end-to-end time) only. TPOT is
// RequestRecord::SloTpotMs() (vLLM's). A limit not set is met by every completed request.
struct SloAttainment {
  int requests = 0;  // completed + failed
  int met_ttft = 0;
  int met_tpot = 0;
  int met_e2e = 0;
  int met_all = 0;  // met every limit set: these make the goodput
  double Fraction(int met) const {
    return requests > 0 ? static_cast<double>(met) / requests : 0.0;
  }
};

// Whether one request met every limit of `slo` (false when it failed).
bool MeetsSlo(const RequestRecord& r, const Slo& slo);

SloAttainment MeasureSloAttainment(const std::vector<const RequestRecord*>& records,
                                   const Slo& slo);

// The report of one class of requests over a run of `duration_s`.
nlohmann::json SummarizeClass(const std::vector<const RequestRecord*>& records, double duration_s,
                              const ReportOptions& options);

// {"duration_s", "classes": {"all", "main", ["background"]}, ["requests"]}.
nlohmann::json BuildReport(const RunResult& result, const ReportOptions& options);

// A human-readable table of a BuildReport() result.
std::string FormatTable(const nlohmann::json& report);

nlohmann::json SummaryJson(const Summary& s);

}  // namespace duet::bench
