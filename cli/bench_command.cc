// `duet bench serve`: the serving load generator (bench/serve_bench) against a duet endpoint.
// Prints a table and writes JSON; see `duet bench serve --help` and README "Serving benchmarks".
//
//   duet bench serve --server 127.0.0.1:7000 --request_rate 0.5 --num_requests 50
//       --input_len 512-1024 --output_len 32 --slo_ttft_ms 5000 --slo_tpot_ms 200 --json_out r.json
//   (one command line)
//   duet bench serve --server ADDR --workload shared_prefix --shared_prefix_len 1024
//       --num_prefixes 4 --suffix_len 32-128 --num_requests 40
//   duet bench serve --server ADDR --workload multi_turn --num_sessions 8 --turns 4
//       --turn_len 32-64 --concurrency 4
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/serve_bench/grpc_client.h"
#include "bench/serve_bench/http_client.h"
#include "bench/serve_bench/prefix_workloads.h"
#include "bench/serve_bench/report.h"
#include "bench/serve_bench/runner.h"
#include "bench/serve_bench/workload.h"
#include "cli/commands.h"

ABSL_DECLARE_FLAG(std::string, server);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(int, timeout_s);
ABSL_DECLARE_FLAG(std::string, api_key);

ABSL_FLAG(double, request_rate, 0, "bench serve: Poisson arrivals per second (0: closed loop)");
ABSL_FLAG(int, concurrency, 1, "bench serve: requests in flight in closed loop");
ABSL_FLAG(int, max_concurrency, 0, "bench serve: cap on requests in flight at a rate (0: none)");
ABSL_FLAG(int, num_requests, 0, "bench serve: measured requests (0: until --duration_s)");
ABSL_FLAG(double, duration_s, 0, "bench serve: stop issuing after this many seconds (0: none)");
ABSL_FLAG(std::string, input_len, "128", "bench serve: prompt tokens, N or A-B (uniform)");
ABSL_FLAG(std::string, output_len, "32", "bench serve: output tokens, N or A-B (uniform)");
ABSL_FLAG(std::string, dataset, "",
          "bench serve: JSONL file of {\"prompt\": \"...\", \"max_tokens\": N} (instead of "
          "random token ids)");
ABSL_FLAG(int, warmup_requests, 1, "bench serve: requests sent one at a time first, not reported");
ABSL_FLAG(int, background_concurrency, 0,
          "bench serve: background requests kept running alongside (class 'background')");
ABSL_FLAG(std::string, background_input_len, "32", "bench serve: background prompt tokens");
ABSL_FLAG(std::string, background_output_len, "128", "bench serve: background output tokens");
ABSL_FLAG(int, min_token_id, 17, "bench serve: random prompt ids are drawn from [min, max]");
ABSL_FLAG(int, max_token_id, 255, "bench serve: see --min_token_id");
ABSL_FLAG(double, slo_ttft_ms, 0, "bench serve: goodput SLO on TTFT (0: none)");
ABSL_FLAG(double, slo_tpot_ms, 0, "bench serve: goodput SLO on TPOT (0: none)");
ABSL_FLAG(double, slo_e2e_ms, 0, "bench serve: goodput SLO on end-to-end time (0: none)");
ABSL_FLAG(std::string, json_out, "", "bench serve: write the JSON report here");
ABSL_FLAG(bool, per_request, false, "bench serve: include every request in the JSON");
ABSL_FLAG(std::string, bench_label, "", "bench serve: a name for this run, copied into the JSON");
ABSL_FLAG(std::string, bench_note, "",
          "bench serve: free text copied into the JSON and table (e.g. the CPU pinning)");
ABSL_FLAG(std::string, workload, "random",
          "bench serve: random (prompts of --input_len), shared_prefix (one of --num_prefixes "
          "fixed prefixes of --shared_prefix_len tokens + a --suffix_len suffix) or multi_turn "
          "(--num_sessions chats of --turns turns, each prompt the whole conversation so far + a "
          "--turn_len user message; gRPC only)");
ABSL_FLAG(int, shared_prefix_len, 1024, "bench serve: shared_prefix: tokens of each prefix");
ABSL_FLAG(int, num_prefixes, 4, "bench serve: shared_prefix: how many distinct prefixes");
ABSL_FLAG(std::string, suffix_len, "32-128", "bench serve: shared_prefix: suffix tokens, N or A-B");
ABSL_FLAG(int, num_sessions, 8, "bench serve: multi_turn: chat sessions");
ABSL_FLAG(int, turns, 4, "bench serve: multi_turn: turns per session");
ABSL_FLAG(std::string, turn_len, "32-64",
          "bench serve: multi_turn: tokens of each turn's new user message, N or A-B");
ABSL_FLAG(int, wait_ready_s, 60, "bench serve: wait this long for the endpoint to be ready");

namespace duet::cli {
namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "duet bench serve: %s\n", msg.c_str());
  return 2;
}

}  // namespace

int RunBench(const std::vector<char*>& args) {
  if (args.size() != 2 || std::string(args[1]) != "serve") {
    return Fail("usage: duet bench serve --server HOST:PORT|http://HOST:PORT [flags] (see --help)");
  }
  const std::string server = absl::GetFlag(FLAGS_server);
  if (server.empty()) return Fail("need --server HOST:PORT (gRPC) or http://HOST:PORT (HTTP API)");
  const std::string workload_name = absl::GetFlag(FLAGS_workload);
  bench::WorkloadKind workload;
  if (absl::Status st = bench::ParseWorkloadKind(workload_name, &workload); !st.ok()) {
    return Fail(std::string(st.message()));
  }
  bench::RunOptions run;
  run.request_rate = absl::GetFlag(FLAGS_request_rate);
  run.concurrency = absl::GetFlag(FLAGS_concurrency);
  run.max_concurrency = absl::GetFlag(FLAGS_max_concurrency);
  run.num_requests = absl::GetFlag(FLAGS_num_requests);
  run.duration_s = absl::GetFlag(FLAGS_duration_s);
  run.warmup_requests = absl::GetFlag(FLAGS_warmup_requests);
  run.background_concurrency = absl::GetFlag(FLAGS_background_concurrency);
  run.seed = absl::GetFlag(FLAGS_seed);
  run.request_timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  if (run.num_requests <= 0 && run.duration_s <= 0 && workload != bench::WorkloadKind::kMultiTurn) {
    return Fail("give --num_requests or --duration_s (or both)");
  }
  if (run.request_rate < 0 || run.concurrency < 1 || run.background_concurrency < 0) {
    return Fail("--request_rate must be >= 0, --concurrency >= 1, --background_concurrency >= 0");
  }

  auto input = bench::ParseLengthRange(absl::GetFlag(FLAGS_input_len));
  auto output = bench::ParseLengthRange(absl::GetFlag(FLAGS_output_len));
  auto bg_input = bench::ParseLengthRange(absl::GetFlag(FLAGS_background_input_len));
  auto bg_output = bench::ParseLengthRange(absl::GetFlag(FLAGS_background_output_len));
  for (const auto* r : {&input, &output, &bg_input, &bg_output}) {
    if (!r->ok()) return Fail(std::string(r->status().message()));
  }
  const int min_id = absl::GetFlag(FLAGS_min_token_id);
  const int max_id = absl::GetFlag(FLAGS_max_token_id);
  if (min_id < 0 || max_id < min_id) return Fail("need 0 <= --min_token_id <= --max_token_id");
  const std::string dataset = absl::GetFlag(FLAGS_dataset);
  const bool is_http = absl::StartsWith(server, "http://");
  if (workload != bench::WorkloadKind::kRandom) {
    if (!dataset.empty()) return Fail("--dataset goes with --workload random only");
    if (run.request_rate > 0) {
      return Fail(absl::StrCat("--workload ", workload_name, " runs closed loop (--concurrency); ",
                               "--request_rate is not implemented for it"));
    }
    if (run.background_concurrency > 0) {
      return Fail(absl::StrCat("--background_concurrency is not implemented with --workload ",
                               workload_name));
    }
  }
  auto suffix = bench::ParseLengthRange(absl::GetFlag(FLAGS_suffix_len));
  auto turn_len = bench::ParseLengthRange(absl::GetFlag(FLAGS_turn_len));
  for (const auto* r : {&suffix, &turn_len}) {
    if (!r->ok()) return Fail(std::string(r->status().message()));
  }
  const bench::SharedPrefixOptions shared{.prefix_len = absl::GetFlag(FLAGS_shared_prefix_len),
                                          .num_prefixes = absl::GetFlag(FLAGS_num_prefixes),
                                          .suffix = *suffix,
                                          .output = *output,
                                          .min_token_id = min_id,
                                          .max_token_id = max_id};
  const bench::MultiTurnOptions chats{.num_sessions = absl::GetFlag(FLAGS_num_sessions),
                                      .turns = absl::GetFlag(FLAGS_turns),
                                      .turn_len = *turn_len,
                                      .output = *output,
                                      .min_token_id = min_id,
                                      .max_token_id = max_id};
  if (workload == bench::WorkloadKind::kSharedPrefix &&
      (shared.prefix_len < 1 || shared.num_prefixes < 1)) {
    return Fail("--shared_prefix_len and --num_prefixes must be >= 1");
  }
  if (workload == bench::WorkloadKind::kMultiTurn) {
    if (chats.num_sessions < 1 || chats.turns < 1) {
      return Fail("--num_sessions and --turns must be >= 1");
    }
    // Each turn's prompt holds the previous turn's generated ids: only the gRPC API streams them.
    if (is_http) return Fail("--workload multi_turn needs the gRPC API (--server HOST:PORT)");
    if (run.num_requests > 0) {
      return Fail(
          "--workload multi_turn sends --num_sessions x --turns requests; drop "
          "--num_requests");
    }
  }

  // Independent seeded streams: arrivals (run.seed), main, background and warm-up prompts.
  const uint64_t seed = run.seed;
  std::unique_ptr<bench::RequestSource> main_source, warmup_source;
  std::unique_ptr<bench::MultiTurnWorkload> sessions;
  if (workload == bench::WorkloadKind::kSharedPrefix) {
    main_source = std::make_unique<bench::SharedPrefixSource>(shared, seed + 1, "main");
    // Warm-up prompts of the same length but no shared prefix: they warm the nodes, not the
    // prefix cache.
    const bench::LengthRange len{shared.prefix_len + shared.suffix.min,
                                 shared.prefix_len + shared.suffix.max};
    warmup_source = std::make_unique<bench::SyntheticSource>(
        bench::SyntheticOptions{len, *output, min_id, max_id}, seed + 3, "warmup");
  } else if (workload == bench::WorkloadKind::kMultiTurn) {
    sessions = std::make_unique<bench::MultiTurnWorkload>(chats, seed + 1, "main");
    warmup_source = std::make_unique<bench::SyntheticSource>(
        bench::SyntheticOptions{*turn_len, *output, min_id, max_id}, seed + 3, "warmup");
  } else if (!dataset.empty()) {
    auto entries = bench::LoadJsonlDataset(dataset);
    if (!entries.ok()) return Fail(std::string(entries.status().message()));
    main_source = std::make_unique<bench::DatasetSource>(*entries, *output, seed + 1, "main");
    warmup_source = std::make_unique<bench::DatasetSource>(*entries, *output, seed + 3, "warmup");
  } else {
    const bench::SyntheticOptions o{*input, *output, min_id, max_id};
    main_source = std::make_unique<bench::SyntheticSource>(o, seed + 1, "main");
    warmup_source = std::make_unique<bench::SyntheticSource>(o, seed + 3, "warmup");
  }
  std::unique_ptr<bench::RequestSource> background;
  if (run.background_concurrency > 0) {
    background = std::make_unique<bench::SyntheticSource>(
        bench::SyntheticOptions{*bg_input, *bg_output, min_id, max_id}, seed + 2, "background");
  }

  // http://HOST:PORT: the OpenAI-compatible HTTP API; HOST:PORT: the Generation gRPC API.
  std::unique_ptr<bench::Client> client =
      is_http ? bench::MakeHttpClient(server, absl::GetFlag(FLAGS_api_key))
              : bench::MakeGrpcClient(server);
  if (absl::Status st = client->WaitReady(absl::Seconds(absl::GetFlag(FLAGS_wait_ready_s)));
      !st.ok()) {
    std::fprintf(stderr, "duet bench serve: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  const std::string started = absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone());
  bench::RunResult result =
      sessions != nullptr
          ? bench::RunSessions(*client, run, *sessions, warmup_source.get())
          : bench::RunBenchmark(*client, run, *main_source, background.get(), warmup_source.get());

  bench::ReportOptions ro;
  ro.slo = {absl::GetFlag(FLAGS_slo_ttft_ms), absl::GetFlag(FLAGS_slo_tpot_ms),
            absl::GetFlag(FLAGS_slo_e2e_ms)};
  ro.per_request = absl::GetFlag(FLAGS_per_request);
  nlohmann::json report = bench::BuildReport(result, ro);
  report["config"] = {{"server", server},
                      {"api", is_http ? "http" : "grpc"},
                      {"workload", workload_name},
                      {"label", absl::GetFlag(FLAGS_bench_label)},
                      {"note", absl::GetFlag(FLAGS_bench_note)},
                      {"started_utc", started},
                      {"request_rate", run.request_rate},
                      {"concurrency", run.request_rate > 0 ? 0 : run.concurrency},
                      {"max_concurrency", run.max_concurrency},
                      {"num_requests", run.num_requests},
                      {"duration_s", run.duration_s},
                      {"warmup_requests", run.warmup_requests},
                      {"seed", seed},
                      {"input_len", dataset.empty() ? absl::GetFlag(FLAGS_input_len) : ""},
                      {"output_len", absl::GetFlag(FLAGS_output_len)},
                      {"dataset", dataset},
                      {"background_concurrency", run.background_concurrency},
                      {"background_input_len", absl::GetFlag(FLAGS_background_input_len)},
                      {"background_output_len", absl::GetFlag(FLAGS_background_output_len)},
                      {"timeout_s", absl::GetFlag(FLAGS_timeout_s)}};
  if (workload == bench::WorkloadKind::kSharedPrefix) {
    report["config"]["shared_prefix_len"] = shared.prefix_len;
    report["config"]["num_prefixes"] = shared.num_prefixes;
    report["config"]["suffix_len"] = absl::GetFlag(FLAGS_suffix_len);
  } else if (workload == bench::WorkloadKind::kMultiTurn) {
    report["config"]["num_sessions"] = chats.num_sessions;
    report["config"]["turns"] = chats.turns;
    report["config"]["turn_len"] = absl::GetFlag(FLAGS_turn_len);
  }
  std::string header = absl::StrCat("duet bench serve: ", server);
  if (!absl::GetFlag(FLAGS_bench_label).empty()) {
    absl::StrAppend(&header, " [", absl::GetFlag(FLAGS_bench_label), "]");
  }
  if (!absl::GetFlag(FLAGS_bench_note).empty()) {
    absl::StrAppend(&header, " (", absl::GetFlag(FLAGS_bench_note), ")");
  }
  std::cout << header << "\n" << bench::FormatTable(report) << std::flush;
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    std::ofstream out(json_out);
    out << report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    if (!out) {
      std::fprintf(stderr, "duet bench serve: cannot write %s\n", json_out.c_str());
      return 1;
    }
  }
  // Failed requests (or chat turns never sent) make the run fail (exit 3) after reporting them.
  return report["classes"]["all"]["requests"]["failed"].get<int>() > 0 || result.abandoned_turns > 0
             ? 3
             : 0;
}

}  // namespace duet::cli
