#include "cli/command_table.h"

#include <algorithm>

namespace duet::cli {
namespace {

using G = FlagGroup;

std::vector<CommandSpec>* MakeSpecs() {
  return new std::vector<CommandSpec>{
      {.id = CommandId::kGenerate,
       .command = "generate",
       .name = "generate",
       .mode_note = "without --server",
       .usage = "duet generate --model DIR (--prompt TEXT | --prompt-ids 1,2) [flags]",
       .summary = "runs the model in this process and prints the text (--json: ids, logprobs, "
                  "timings)",
       .groups = {G::kModel, G::kEngine, G::kRequest, G::kSampling, G::kPromptText}},
      {.id = CommandId::kGenerateServer,
       .command = "generate",
       .name = "generate --server",
       .selector = "server",
       .mode_note = "with --server",
       .usage = "duet generate --server HOST:PORT (--prompt TEXT | --prompt-ids 1,2) [flags]",
       .summary = "the same request, served by a cluster (a coordinator or duet serve)",
       .groups = {G::kClient, G::kRequest, G::kSampling, G::kTls}},
      {.id = CommandId::kCoordinator,
       .command = "coordinator",
       .name = "coordinator",
       .usage = "duet coordinator --model DIR [--listen HOST:PORT] [--http-port P] "
                "[--etcd-endpoints URLS] [flags]",
       .summary = "runs the coordinator until SIGINT or SIGTERM",
       .cluster_process = true,
       .groups = {G::kModel, G::kProcess, G::kRouting, G::kEtcd, G::kHttp, G::kApiKey, G::kTls,
                  G::kHttps}},
      {.id = CommandId::kPrefill,
       .command = "prefill",
       .name = "prefill",
       .usage = "duet prefill (--coordinator HOST:PORT | --etcd-endpoints URLS) --model DIR "
                "[flags]",
       .summary = "runs a prefill node until SIGINT or SIGTERM",
       .cluster_process = true,
       .groups = {G::kModel, G::kEngine, G::kNode, G::kProcess, G::kMembership, G::kEtcd,
                  G::kEtcdLease, G::kTransport, G::kPrefill, G::kTls}},
      {.id = CommandId::kDecode,
       .command = "decode",
       .name = "decode",
       .usage = "duet decode (--coordinator HOST:PORT | --etcd-endpoints URLS) --model DIR "
                "[flags]",
       .summary = "runs a decode node until SIGINT or SIGTERM",
       .cluster_process = true,
       .groups = {G::kModel, G::kEngine, G::kNode, G::kProcess, G::kMembership, G::kEtcd,
                  G::kEtcdLease, G::kTransport, G::kDecode, G::kTls}},
      // The launcher gives each child its address, coordinator, id and metrics port; it takes
      // every other flag of its children and hands each child those of its groups.
      {.id = CommandId::kServeLoopback,
       .command = "serve",
       .name = "serve --loopback",
       .selector = "loopback",
       .mode_note = "with --loopback",
       .usage = "duet serve --loopback --model DIR [--prefill N --decode M] [--port P] [flags]",
       .summary = "the whole cluster on this machine: a coordinator and the nodes as child "
                  "processes on 127.0.0.1",
       .cluster_process = true,
       .groups = {G::kServe, G::kSupervisor, G::kModel, G::kEngine, G::kNode, G::kTransport,
                  G::kPrefill, G::kDecode, G::kRouting, G::kHttp, G::kApiKey, G::kTls, G::kHttps},
       .except = {"metrics_port"}},
      // One process: no transport, no layer pipelining, no quarantine of abandoned transfers.
      {.id = CommandId::kServeColocated,
       .command = "serve",
       .name = "serve --colocated",
       .selector = "colocated",
       .mode_note = "with --colocated",
       .usage = "duet serve --colocated --model DIR [--port P] [flags]",
       .summary = "prefill and decode in one process, behind the same client API",
       .groups = {G::kServe, G::kModel, G::kEngine, G::kNode, G::kPrefill, G::kDecode, G::kHttp,
                  G::kApiKey, G::kTls, G::kHttps},
       .except = {"no_layer_pipelining", "kv_quarantine_bound"}},
      {.id = CommandId::kBenchServe,
       .command = "bench",
       .name = "bench serve",
       .subcommand = "serve",
       .usage = "duet bench serve --server HOST:PORT|http://HOST:PORT (--num-requests N | "
                "--duration-s S) [flags]",
       .summary = "the serving load generator: TTFT, TPOT and goodput at a rate or concurrency",
       .groups = {G::kClient, G::kBench, G::kSampling, G::kApiKey, G::kTls}},
  };
}

}  // namespace

bool CommandSpec::Takes(absl::string_view flag) const {
  if (std::find(except.begin(), except.end(), flag) != except.end()) return false;
  const std::optional<FlagGroup> group = GroupOfFlag(flag);
  return group && std::find(groups.begin(), groups.end(), *group) != groups.end();
}

std::vector<const absl::CommandLineFlag*> CommandSpec::Flags() const {
  std::vector<const absl::CommandLineFlag*> flags;
  for (FlagGroup g : groups) {
    for (const absl::CommandLineFlag* f : FlagGroupInfoOf(g).flags) {
      if (std::find(except.begin(), except.end(), f->Name()) == except.end()) flags.push_back(f);
    }
  }
  return flags;
}

const std::vector<CommandSpec>& AllCommandSpecs() {
  static const std::vector<CommandSpec>* const specs = MakeSpecs();
  return *specs;
}

const CommandSpec& SpecOf(CommandId id) {
  for (const CommandSpec& s : AllCommandSpecs()) {
    if (s.id == id) return s;
  }
  return AllCommandSpecs().front();  // unreachable: every id has a spec (command_table_test)
}

std::vector<const CommandSpec*> SpecsOfCommand(absl::string_view command) {
  std::vector<const CommandSpec*> specs;
  for (const CommandSpec& s : AllCommandSpecs()) {
    if (s.command == command) specs.push_back(&s);
  }
  return specs;
}

std::vector<absl::string_view> CommandNames() {
  std::vector<absl::string_view> names;
  for (const CommandSpec& s : AllCommandSpecs()) {
    if (std::find(names.begin(), names.end(), s.command) == names.end()) {
      names.push_back(s.command);
    }
  }
  return names;
}

}  // namespace duet::cli
