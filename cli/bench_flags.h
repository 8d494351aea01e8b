// The flag group of `duet bench serve` (flag_groups.h), read into typed options: the load, the
// workload (bench::WorkloadKind) and its lengths (bench::LengthRange), the SLOs and the report.
// The server, deadline, seed and API key are the client, sampling and API-key groups
// (generate_flags.h, http_flags.h).
//
//   absl::StatusOr<BenchFlags> b = ReadBenchFlags();  // "--input-len: ..." on a bad range
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/serve_bench/prefix_workloads.h"
#include "bench/serve_bench/workload.h"

namespace duet::cli {

// A length flag: N or A-B, as given (for the report) and parsed.
struct LengthFlag {
  std::string text;
  bench::LengthRange range;
};

struct BenchFlags {
  double request_rate = 0;  // Poisson arrivals per second (0: closed loop)
  int concurrency = 1;
  int max_concurrency = 0;
  int num_requests = 0;
  double duration_s = 0;
  LengthFlag input_len;
  LengthFlag output_len;
  std::string dataset;
  int warmup_requests = 0;
  int background_concurrency = 0;
  LengthFlag background_input_len;
  LengthFlag background_output_len;
  int min_token_id = 0;
  int max_token_id = 0;
  double slo_ttft_ms = 0;
  double slo_tpot_ms = 0;
  double slo_e2e_ms = 0;
  double slo_attainment = 0.9;
  std::string json_out;
  bool per_request = false;
  std::string label;
  std::string note;
  bench::WorkloadKind workload = bench::WorkloadKind::kRandom;
  std::string workload_name;
  int shared_prefix_len = 0;
  int num_prefixes = 0;
  LengthFlag suffix_len;
  int num_sessions = 0;
  int turns = 0;
  LengthFlag turn_len;
  absl::Duration wait_ready;  // --wait-ready-s
};

// INVALID_ARGUMENT naming the flag for an unknown --workload or a length that is not N or A-B.
absl::StatusOr<BenchFlags> ReadBenchFlags();

}  // namespace duet::cli
