// `duet bench serve`: the serving load generator (bench/serve_bench) against a duet endpoint.
// Prints a table and writes JSON; see `duet bench serve --help` and README "Serving benchmarks".
//
//   duet bench serve --server 127.0.0.1:7000 --request-rate 0.5 --num-requests 50
//       --input-len 512-1024 --output-len 32 --slo-ttft-ms 5000 --slo-tpot-ms 200 --json-out r.json
//   (one command line)
//   duet bench serve --server ADDR --workload shared_prefix --shared-prefix-len 1024
//       --num-prefixes 4 --suffix-len 32-128 --num-requests 40
//   duet bench serve --server ADDR --workload multi_turn --num-sessions 8 --turns 4
//       --turn-len 32-64 --concurrency 4
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/serve_bench/grpc_client.h"
#include "bench/serve_bench/http_client.h"
#include "bench/serve_bench/prefix_workloads.h"
#include "bench/serve_bench/report.h"
#include "bench/serve_bench/runner.h"
#include "bench/serve_bench/workload.h"
#include "cli/bench_flags.h"
#include "cli/commands.h"
#include "cli/generate_flags.h"
#include "cli/http_flags.h"
#include "proto/channel.h"

namespace duet::cli {
namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "duet bench serve: %s\n", msg.c_str());
  return 2;
}

}  // namespace

int RunBenchServe(const CommandLine& line) {
  const ClientFlags client_flags = ReadClientFlags();
  const std::string& server = client_flags.server;
  if (server.empty()) return Fail("need --server HOST:PORT (gRPC) or http://HOST:PORT (HTTP API)");
  absl::StatusOr<BenchFlags> flags = ReadBenchFlags();
  if (!flags.ok()) return Fail(std::string(flags.status().message()));
  const BenchFlags& b = *flags;
  const bench::Slo slo{.ttft_ms = b.slo_ttft_ms,
                       .tpot_ms = b.slo_tpot_ms,
                       .e2e_ms = b.slo_e2e_ms,
                       .attainment = b.slo_attainment};
  if (absl::Status st = bench::CheckSloFlags(slo, line.given); !st.ok()) {
    return Fail(std::string(st.message()));
  }
  const bench::WorkloadKind workload = b.workload;
  const std::string& workload_name = b.workload_name;
  bench::RunOptions run;
  run.request_rate = b.request_rate;
  run.concurrency = b.concurrency;
  run.max_concurrency = b.max_concurrency;
  run.num_requests = b.num_requests;
  run.duration_s = b.duration_s;
  run.warmup_requests = b.warmup_requests;
  run.background_concurrency = b.background_concurrency;
  const SamplingFlags sampling = ReadSamplingFlags();
  run.seed = sampling.seed;
  // Every request ignores EOS so that it yields exactly its output length.
  if (!sampling.ignore_eos &&
      std::find(line.given.begin(), line.given.end(), "ignore_eos") != line.given.end()) {
    return Fail(
        "--ignore-eos=false is not implemented: every request ignores EOS (exact output "
        "lengths)");
  }
  run.request_timeout = client_flags.timeout;
  if (run.num_requests <= 0 && run.duration_s <= 0 && workload != bench::WorkloadKind::kMultiTurn) {
    return Fail("give --num-requests or --duration-s (or both)");
  }
  if (run.request_rate < 0 || run.concurrency < 1 || run.background_concurrency < 0) {
    return Fail("--request-rate must be >= 0, --concurrency >= 1, --background-concurrency >= 0");
  }
  const bench::LengthRange& output = b.output_len.range;
  const int min_id = b.min_token_id;
  const int max_id = b.max_token_id;
  if (min_id < 0 || max_id < min_id) return Fail("need 0 <= --min-token-id <= --max-token-id");
  const std::string& dataset = b.dataset;
  const bool is_http = absl::StartsWith(server, "http://");
  if (is_http && rpc::ProcessTls() != nullptr) {
    return Fail(
        "--tls-ca-file, --tls-cert-file and --tls-key-file secure the gRPC API; the "
        "HTTP client (--server http://...) does not implement TLS");
  }
  if (workload != bench::WorkloadKind::kRandom) {
    if (!dataset.empty()) return Fail("--dataset goes with --workload random only");
    if (run.request_rate > 0) {
      return Fail(absl::StrCat("--workload ", workload_name, " runs closed loop (--concurrency); ",
                               "--request-rate is not implemented for it"));
    }
    if (run.background_concurrency > 0) {
      return Fail(absl::StrCat("--background-concurrency is not implemented with --workload ",
                               workload_name));
    }
  }
  const bench::SharedPrefixOptions shared{.prefix_len = b.shared_prefix_len,
                                          .num_prefixes = b.num_prefixes,
                                          .suffix = b.suffix_len.range,
                                          .output = output,
                                          .min_token_id = min_id,
                                          .max_token_id = max_id};
  const bench::MultiTurnOptions chats{.num_sessions = b.num_sessions,
                                      .turns = b.turns,
                                      .turn_len = b.turn_len.range,
                                      .output = output,
                                      .min_token_id = min_id,
                                      .max_token_id = max_id};
  if (workload == bench::WorkloadKind::kSharedPrefix &&
      (shared.prefix_len < 1 || shared.num_prefixes < 1)) {
    return Fail("--shared-prefix-len and --num-prefixes must be >= 1");
  }
  if (workload == bench::WorkloadKind::kMultiTurn) {
    if (chats.num_sessions < 1 || chats.turns < 1) {
      return Fail("--num-sessions and --turns must be >= 1");
    }
    // Each turn's prompt holds the previous turn's generated ids: only the gRPC API streams them.
    if (is_http) return Fail("--workload multi_turn needs the gRPC API (--server HOST:PORT)");
    if (run.num_requests > 0) {
      return Fail(
          "--workload multi_turn sends --num-sessions x --turns requests; drop "
          "--num-requests");
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
        bench::SyntheticOptions{len, output, min_id, max_id}, seed + 3, "warmup");
  } else if (workload == bench::WorkloadKind::kMultiTurn) {
    sessions = std::make_unique<bench::MultiTurnWorkload>(chats, seed + 1, "main");
    warmup_source = std::make_unique<bench::SyntheticSource>(
        bench::SyntheticOptions{b.turn_len.range, output, min_id, max_id}, seed + 3, "warmup");
  } else if (!dataset.empty()) {
    auto entries = bench::LoadJsonlDataset(dataset);
    if (!entries.ok()) return Fail(std::string(entries.status().message()));
    main_source = std::make_unique<bench::DatasetSource>(*entries, output, seed + 1, "main");
    warmup_source = std::make_unique<bench::DatasetSource>(*entries, output, seed + 3, "warmup");
  } else {
    const bench::SyntheticOptions o{b.input_len.range, output, min_id, max_id};
    main_source = std::make_unique<bench::SyntheticSource>(o, seed + 1, "main");
    warmup_source = std::make_unique<bench::SyntheticSource>(o, seed + 3, "warmup");
  }
  std::unique_ptr<bench::RequestSource> background;
  if (run.background_concurrency > 0) {
    background = std::make_unique<bench::SyntheticSource>(
        bench::SyntheticOptions{b.background_input_len.range, b.background_output_len.range, min_id,
                                max_id},
        seed + 2, "background");
  }

  // http://HOST:PORT: the OpenAI-compatible HTTP API; HOST:PORT: the Generation gRPC API.
  std::unique_ptr<bench::Client> client =
      is_http ? bench::MakeHttpClient(server, ReadApiKeyFlag()) : bench::MakeGrpcClient(server);
  if (absl::Status st = client->WaitReady(b.wait_ready); !st.ok()) {
    std::fprintf(stderr, "duet bench serve: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  const std::string started = absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone());
  bench::RunResult result =
      sessions != nullptr
          ? bench::RunSessions(*client, run, *sessions, warmup_source.get())
          : bench::RunBenchmark(*client, run, *main_source, background.get(), warmup_source.get());

  bench::ReportOptions ro;
  ro.slo = slo;
  ro.per_request = b.per_request;
  nlohmann::json report = bench::BuildReport(result, ro);
  report["config"] = {{"server", server},
                      {"api", is_http ? "http" : "grpc"},
                      {"workload", workload_name},
                      {"label", b.label},
                      {"note", b.note},
                      {"started_utc", started},
                      {"request_rate", run.request_rate},
                      {"concurrency", run.request_rate > 0 ? 0 : run.concurrency},
                      {"max_concurrency", run.max_concurrency},
                      {"num_requests", run.num_requests},
                      {"duration_s", run.duration_s},
                      {"warmup_requests", run.warmup_requests},
                      {"seed", seed},
                      {"input_len", dataset.empty() ? b.input_len.text : ""},
                      {"output_len", b.output_len.text},
                      {"dataset", dataset},
                      {"background_concurrency", run.background_concurrency},
                      {"background_input_len", b.background_input_len.text},
                      {"background_output_len", b.background_output_len.text},
                      {"timeout_s", absl::ToInt64Seconds(client_flags.timeout)}};
  if (workload == bench::WorkloadKind::kSharedPrefix) {
    report["config"]["shared_prefix_len"] = shared.prefix_len;
    report["config"]["num_prefixes"] = shared.num_prefixes;
    report["config"]["suffix_len"] = b.suffix_len.text;
  } else if (workload == bench::WorkloadKind::kMultiTurn) {
    report["config"]["num_sessions"] = chats.num_sessions;
    report["config"]["turns"] = chats.turns;
    report["config"]["turn_len"] = b.turn_len.text;
  }
  std::string header = absl::StrCat("duet bench serve: ", server);
  if (!b.label.empty()) {
    absl::StrAppend(&header, " [", b.label, "]");
  }
  if (!b.note.empty()) {
    absl::StrAppend(&header, " (", b.note, ")");
  }
  std::cout << header << "\n" << bench::FormatTable(report) << std::flush;
  const std::string& json_out = b.json_out;
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
