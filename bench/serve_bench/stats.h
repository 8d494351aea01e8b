// Summary statistics for the serving benchmark: percentiles (linear interpolation between
// closest ranks, as numpy's default), mean, and the goodput of a set of requests under SLOs.
//
//   duet::bench::Summary s = duet::bench::Summarize({12.0, 15.5, 9.1});
//   double p99 = s.p99;                       // 15.5 - a little
//   double p = duet::bench::Percentile(sorted_values, 50);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace duet::bench {

// The q-th percentile (0 <= q <= 100) of `sorted` (ascending). Linear interpolation between the
// two closest ranks; 0 for an empty input.
double Percentile(const std::vector<double>& sorted, double q);

struct Summary {
  int64_t count = 0;
  double mean = 0;
  double min = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
  double max = 0;
};

// Sorts a copy of `values` and summarises it; all zero (count 0) for an empty input.
Summary Summarize(std::vector<double> values);

// Service-level objectives; a limit <= 0 is not checked. `attainment`: the fraction of requests
// that must meet every limit for a run to count as within the SLO (DistServe's goodput is the
// highest rate at which it does).
struct Slo {
  double ttft_ms = 0;
  double tpot_ms = 0;
  double e2e_ms = 0;
  double attainment = 0.9;
};

// INVALID_ARGUMENT naming the flag when a limit given on the command line (`given`: the Abseil
// flag names given, e.g. "slo_ttft_ms") is <= 0, or `attainment` is outside (0, 1]:
// "--slo-tpot-ms must be > 0 (got 0)".
absl::Status CheckSloFlags(const Slo& slo, const std::vector<std::string>& given);

// Whether one completed request met every SLO. A request with a single output token has no
// TPOT: only its TTFT and end-to-end time are checked.
bool MeetsSlo(const Slo& slo, double ttft_ms, double tpot_ms, bool has_tpot, double e2e_ms);

}  // namespace duet::bench
