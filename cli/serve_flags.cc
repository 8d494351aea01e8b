#include "cli/serve_flags.h"

#include "absl/flags/flag.h"
#include "cli/flag_groups.h"

ABSL_FLAG(bool, loopback, false,
          "the whole cluster on this machine: a coordinator, --prefill and --decode nodes as "
          "child processes on 127.0.0.1");
ABSL_FLAG(bool, colocated, false,
          "prefill and decode in this one process (continuous batching under "
          "--max-batch-tokens and --max-running), behind the same client API");
ABSL_FLAG(int, port, 0, "the client (gRPC) port (0: any free port)");
ABSL_FLAG(bool, node_metrics, false,
          "every node (or the --colocated server) serves GET /metrics on a free 127.0.0.1 port "
          "(printed when ready)");

ABSL_FLAG(int, prefill, 1, "number of prefill nodes");
ABSL_FLAG(int, decode, 1, "number of decode nodes");
ABSL_FLAG(int, ready_timeout_s, 120, "how long (s) to wait for every node to register");
ABSL_FLAG(bool, no_restart, false,
          "do not restart a child that dies (a dead coordinator then stops everything)");
ABSL_FLAG(int, restart_limit, 5, "restarts of each child at most (then it stays down)");

namespace duet::cli {

std::vector<FlagGroupInfo> ServeFlagGroups() {
  return {
      {FlagGroup::kServe,
       "serve",
       "serve",
       {&absl::GetFlagReflectionHandle(FLAGS_loopback),
        &absl::GetFlagReflectionHandle(FLAGS_colocated), &absl::GetFlagReflectionHandle(FLAGS_port),
        &absl::GetFlagReflectionHandle(FLAGS_node_metrics)}},
      {FlagGroup::kSupervisor,
       "supervisor",
       "serve --loopback: nodes and restarts",
       {&absl::GetFlagReflectionHandle(FLAGS_prefill), &absl::GetFlagReflectionHandle(FLAGS_decode),
        &absl::GetFlagReflectionHandle(FLAGS_ready_timeout_s),
        &absl::GetFlagReflectionHandle(FLAGS_no_restart),
        &absl::GetFlagReflectionHandle(FLAGS_restart_limit)}}};
}

ServeFlags ReadServeFlags() {
  return {.port = absl::GetFlag(FLAGS_port), .node_metrics = absl::GetFlag(FLAGS_node_metrics)};
}

SupervisorFlags ReadSupervisorFlags() {
  return {.prefill = absl::GetFlag(FLAGS_prefill),
          .decode = absl::GetFlag(FLAGS_decode),
          .ready_timeout = absl::Seconds(absl::GetFlag(FLAGS_ready_timeout_s)),
          .restart = !absl::GetFlag(FLAGS_no_restart),
          .restart_limit = absl::GetFlag(FLAGS_restart_limit)};
}

}  // namespace duet::cli
