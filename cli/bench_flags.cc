#include "cli/bench_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/flag_groups.h"

ABSL_FLAG(double, request_rate, 0, "Poisson arrivals per second (0: closed loop)");
ABSL_FLAG(int, concurrency, 1, "requests in flight in closed loop");
ABSL_FLAG(int, max_concurrency, 0, "cap on requests in flight at a rate (0: none)");
ABSL_FLAG(int, num_requests, 0, "measured requests (0: until --duration-s)");
ABSL_FLAG(double, duration_s, 0, "stop issuing after this many seconds (0: none)");
ABSL_FLAG(std::string, input_len, "128", "prompt tokens, N or A-B (uniform)");
ABSL_FLAG(std::string, output_len, "32", "output tokens, N or A-B (uniform)");
ABSL_FLAG(std::string, dataset, "",
          "JSONL file of {\"prompt\": \"...\", \"max_tokens\": N} (instead of random token ids)");
ABSL_FLAG(int, warmup_requests, 1, "requests sent one at a time first, not reported");
ABSL_FLAG(int, background_concurrency, 0,
          "background requests kept running alongside (class 'background')");
ABSL_FLAG(std::string, background_input_len, "32", "background prompt tokens, N or A-B");
ABSL_FLAG(std::string, background_output_len, "128", "background output tokens, N or A-B");
ABSL_FLAG(int, min_token_id, 17, "random prompt ids are drawn from [min, max]");
ABSL_FLAG(int, max_token_id, 255, "see --min-token-id");
ABSL_FLAG(double, slo_ttft_ms, 0, "goodput SLO on TTFT, ms (> 0; not given: none)");
ABSL_FLAG(double, slo_tpot_ms, 0,
          "goodput SLO on TPOT, (end - first token) / (output tokens - 1), ms (> 0; not given: "
          "none; 1-token outputs are judged on TTFT only)");
ABSL_FLAG(double, slo_e2e_ms, 0, "goodput SLO on end-to-end time, ms (> 0; not given: none)");
ABSL_FLAG(double, slo_attainment, 0.9,
          "in (0, 1]: the fraction of requests that must meet every SLO for the run to count as "
          "within it (DistServe's goodput: the highest rate at which it does)");
ABSL_FLAG(std::string, json_out, "", "write the JSON report here");
ABSL_FLAG(bool, per_request, false, "include every request in the JSON");
ABSL_FLAG(std::string, bench_label, "", "a name for this run, copied into the JSON");
ABSL_FLAG(std::string, bench_note, "",
          "free text copied into the JSON and table (e.g. the CPU pinning)");
ABSL_FLAG(std::string, workload, "random",
          "random (prompts of --input-len), shared_prefix (one of --num-prefixes fixed prefixes "
          "of --shared-prefix-len tokens + a --suffix-len suffix) or multi_turn (--num-sessions "
          "chats of --turns turns, each prompt the whole conversation so far + a --turn-len user "
          "message; gRPC only)");
ABSL_FLAG(int, shared_prefix_len, 1024, "shared_prefix: tokens of each prefix");
ABSL_FLAG(int, num_prefixes, 4, "shared_prefix: how many distinct prefixes");
ABSL_FLAG(std::string, suffix_len, "32-128", "shared_prefix: suffix tokens, N or A-B");
ABSL_FLAG(int, num_sessions, 8, "multi_turn: chat sessions");
ABSL_FLAG(int, turns, 4, "multi_turn: turns per session");
ABSL_FLAG(std::string, turn_len, "32-64",
          "multi_turn: tokens of each turn's new user message, N or A-B");
ABSL_FLAG(int, wait_ready_s, 60, "wait this long (s) for the endpoint to be ready");

namespace duet::cli {
namespace {

absl::StatusOr<LengthFlag> ReadLength(const absl::Flag<std::string>& flag) {
  LengthFlag l{.text = absl::GetFlag(flag)};
  auto range = bench::ParseLengthRange(l.text);
  if (!range.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", DashedFlagName(absl::GetFlagReflectionHandle(flag).Name()), ": ",
                     range.status().message()));
  }
  l.range = *range;
  return l;
}

}  // namespace

std::vector<FlagGroupInfo> BenchFlagGroups() {
  return {{FlagGroup::kBench,
           "bench",
           "bench serve: load, workload and report",
           {&absl::GetFlagReflectionHandle(FLAGS_request_rate),
            &absl::GetFlagReflectionHandle(FLAGS_concurrency),
            &absl::GetFlagReflectionHandle(FLAGS_max_concurrency),
            &absl::GetFlagReflectionHandle(FLAGS_num_requests),
            &absl::GetFlagReflectionHandle(FLAGS_duration_s),
            &absl::GetFlagReflectionHandle(FLAGS_input_len),
            &absl::GetFlagReflectionHandle(FLAGS_output_len),
            &absl::GetFlagReflectionHandle(FLAGS_dataset),
            &absl::GetFlagReflectionHandle(FLAGS_warmup_requests),
            &absl::GetFlagReflectionHandle(FLAGS_background_concurrency),
            &absl::GetFlagReflectionHandle(FLAGS_background_input_len),
            &absl::GetFlagReflectionHandle(FLAGS_background_output_len),
            &absl::GetFlagReflectionHandle(FLAGS_min_token_id),
            &absl::GetFlagReflectionHandle(FLAGS_max_token_id),
            &absl::GetFlagReflectionHandle(FLAGS_slo_ttft_ms),
            &absl::GetFlagReflectionHandle(FLAGS_slo_tpot_ms),
            &absl::GetFlagReflectionHandle(FLAGS_slo_e2e_ms),
            &absl::GetFlagReflectionHandle(FLAGS_slo_attainment),
            &absl::GetFlagReflectionHandle(FLAGS_json_out),
            &absl::GetFlagReflectionHandle(FLAGS_per_request),
            &absl::GetFlagReflectionHandle(FLAGS_bench_label),
            &absl::GetFlagReflectionHandle(FLAGS_bench_note),
            &absl::GetFlagReflectionHandle(FLAGS_workload),
            &absl::GetFlagReflectionHandle(FLAGS_shared_prefix_len),
            &absl::GetFlagReflectionHandle(FLAGS_num_prefixes),
            &absl::GetFlagReflectionHandle(FLAGS_suffix_len),
            &absl::GetFlagReflectionHandle(FLAGS_num_sessions),
            &absl::GetFlagReflectionHandle(FLAGS_turns),
            &absl::GetFlagReflectionHandle(FLAGS_turn_len),
            &absl::GetFlagReflectionHandle(FLAGS_wait_ready_s)}}};
}

absl::StatusOr<BenchFlags> ReadBenchFlags() {
  BenchFlags b{.request_rate = absl::GetFlag(FLAGS_request_rate),
               .concurrency = absl::GetFlag(FLAGS_concurrency),
               .max_concurrency = absl::GetFlag(FLAGS_max_concurrency),
               .num_requests = absl::GetFlag(FLAGS_num_requests),
               .duration_s = absl::GetFlag(FLAGS_duration_s),
               .dataset = absl::GetFlag(FLAGS_dataset),
               .warmup_requests = absl::GetFlag(FLAGS_warmup_requests),
               .background_concurrency = absl::GetFlag(FLAGS_background_concurrency),
               .min_token_id = absl::GetFlag(FLAGS_min_token_id),
               .max_token_id = absl::GetFlag(FLAGS_max_token_id),
               .slo_ttft_ms = absl::GetFlag(FLAGS_slo_ttft_ms),
               .slo_tpot_ms = absl::GetFlag(FLAGS_slo_tpot_ms),
               .slo_e2e_ms = absl::GetFlag(FLAGS_slo_e2e_ms),
               .slo_attainment = absl::GetFlag(FLAGS_slo_attainment),
               .json_out = absl::GetFlag(FLAGS_json_out),
               .per_request = absl::GetFlag(FLAGS_per_request),
               .label = absl::GetFlag(FLAGS_bench_label),
               .note = absl::GetFlag(FLAGS_bench_note),
               .workload_name = absl::GetFlag(FLAGS_workload),
               .shared_prefix_len = absl::GetFlag(FLAGS_shared_prefix_len),
               .num_prefixes = absl::GetFlag(FLAGS_num_prefixes),
               .num_sessions = absl::GetFlag(FLAGS_num_sessions),
               .turns = absl::GetFlag(FLAGS_turns),
               .wait_ready = absl::Seconds(absl::GetFlag(FLAGS_wait_ready_s))};
  if (absl::Status st = bench::ParseWorkloadKind(b.workload_name, &b.workload); !st.ok()) {
    return st;
  }
  for (auto [out, flag] :
       {std::pair{&b.input_len, &FLAGS_input_len}, std::pair{&b.output_len, &FLAGS_output_len},
        std::pair{&b.background_input_len, &FLAGS_background_input_len},
        std::pair{&b.background_output_len, &FLAGS_background_output_len},
        std::pair{&b.suffix_len, &FLAGS_suffix_len}, std::pair{&b.turn_len, &FLAGS_turn_len}}) {
    auto length = ReadLength(*flag);
    if (!length.ok()) return length.status();
    *out = *std::move(length);
  }
  return b;
}

}  // namespace duet::cli
