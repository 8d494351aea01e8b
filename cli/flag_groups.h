// The flag groups of `duet`: every flag is defined once, in the file of its group
// (model_flags.cc, node_flags.cc, transport_flags.cc, coordinator_flags.cc, http_flags.cc,
// serve_flags.cc, generate_flags.cc, bench_flags.cc, tls_flags.cc, etcd_flags.cc), belongs to
// exactly one group, and each group is read once into a typed options struct by its file. A command
// takes whole groups (command_table.h); a flag of a group it does not take is refused by name.
//
//   const FlagGroupInfo& g = FlagGroupInfoOf(FlagGroup::kTransport);  // g.flags: its flags
//   std::optional<FlagGroup> group = GroupOfFlag("router");         // FlagGroup::kRouting
//   DashedFlagName("max_batch_tokens");                              // "max-batch-tokens"
//   absl::StatusOr<compute::CpuGemm> g = FlagValue("cpu_gemm", compute::ParseCpuGemm(v));
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace duet::cli {

enum class FlagGroup {
  kModel,       // --model
  kEngine,      // how the model runs: device, threads, dtypes, KV pool
  kNode,        // a serving node's prefix cache and /metrics
  kProcess,     // a cluster process's gRPC address and address file
  kMembership,  // a node's coordinator and id
  kEtcd,        // membership on etcd: endpoints and key prefix (nodes and coordinators)
  kEtcdLease,   // membership on etcd: a node's lease
  kTransport,   // KV transport between prefill and decode nodes
  kPrefill,     // the prefill node's batch
  kDecode,      // the decode node's batch and quarantine
  kRouting,     // the coordinator: membership timeouts, queueing, routing
  kHttp,        // the OpenAI-compatible HTTP API
  kApiKey,      // the HTTP API's key (server and client)
  kTls,         // gRPC mutual TLS: CA, certificate and key (every gRPC server and client)
  kHttps,       // HTTPS on the HTTP API, optionally requiring client certificates
  kServe,       // serve: its mode, port and node metrics
  kSupervisor,  // serve --loopback: node counts, start-up, restarts
  kRequest,     // generate: the prompt, sampling and output
  kSampling,    // seed and EOS: generate's sampling; bench serve's workload seed
  kPromptText,  // generate in this process: BOS and the chat template
  kClient,      // generate --server, bench serve: the server and deadline
  kBench,       // bench serve: load, workload and report
};

struct FlagGroupInfo {
  FlagGroup group;
  absl::string_view name;   // "transport"
  absl::string_view title;  // "KV transport between prefill and decode nodes"
  std::vector<const absl::CommandLineFlag*> flags;  // in the order help lists them
};

// Every group, in FlagGroup order.
const std::vector<FlagGroupInfo>& AllFlagGroups();
const FlagGroupInfo& FlagGroupInfoOf(FlagGroup group);
// The group of the flag named `name` (as Abseil names it: "max_batch_tokens"); nullopt for a
// name that is no duet flag (Abseil's own --flagfile, an unknown name).
std::optional<FlagGroup> GroupOfFlag(absl::string_view name);
// The documented spelling: underscores as dashes ("max_batch_tokens" -> "max-batch-tokens").
std::string DashedFlagName(absl::string_view name);
// A flag's value as its enum's Parse function (or ParseOrAuto, common/base/auto_option.h) made
// it; a refusal (which names the valid values) is InvalidArgument naming the flag too:
// "--kv-dtype: unknown kv_dtype 'int4': valid values are f32, f16, bf16, int8, fp8, or auto".
template <typename T>
absl::StatusOr<T> FlagValue(absl::string_view name, absl::StatusOr<T> parsed) {
  if (parsed.ok()) return parsed;
  return absl::InvalidArgumentError(
      absl::StrCat("--", DashedFlagName(name), ": ", parsed.status().message()));
}

// Each group's flags, listed by the file that defines them (flag_groups.cc gathers them).
std::vector<FlagGroupInfo> ModelFlagGroups();        // model_flags.cc: kModel, kEngine
std::vector<FlagGroupInfo> NodeFlagGroups();         // node_flags.cc: kNode .. kDecode
std::vector<FlagGroupInfo> TransportFlagGroups();    // transport_flags.cc: kTransport
std::vector<FlagGroupInfo> CoordinatorFlagGroups();  // coordinator_flags.cc: kRouting
std::vector<FlagGroupInfo> HttpFlagGroups();         // http_flags.cc: kHttp, kApiKey
std::vector<FlagGroupInfo> ServeFlagGroups();        // serve_flags.cc: kServe, kSupervisor
std::vector<FlagGroupInfo> GenerateFlagGroups();     // generate_flags.cc: kRequest .. kClient
std::vector<FlagGroupInfo> BenchFlagGroups();        // bench_flags.cc: kBench
std::vector<FlagGroupInfo> TlsFlagGroups();          // tls_flags.cc: kTls, kHttps
std::vector<FlagGroupInfo> EtcdFlagGroups();         // etcd_flags.cc: kEtcd, kEtcdLease

}  // namespace duet::cli
