#include "cli/coordinator_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/flag_groups.h"
#include "coordinator/request_tracker.h"

ABSL_FLAG(int64_t, heartbeat_timeout_ms, 3000, "silence (ms) that declares a node dead");
ABSL_FLAG(int64_t, queue_timeout_ms,
          absl::ToInt64Milliseconds(duet::coordinator::TrackerOptions{}.queue_timeout),
          "how long (ms) a request may wait for a prefill and a decode node with room before it "
          "is refused (RESOURCE_EXHAUSTED, HTTP 429)");
ABSL_FLAG(int32_t, max_resumes, duet::coordinator::TrackerOptions{}.max_resumes,
          "how many times a request may be continued on another decode node (preempted there "
          "for room, or the node died) before it fails");
ABSL_FLAG(std::string, router, "cache_aware",
          "how requests are routed: cache_aware (the prefill/decode pair of lowest cost: prompt "
          "tokens to compute, queue, KV blocks to send, decode batch; prefixes the nodes cache "
          "count), load (least loaded decode, least queued prefill) or round_robin");
ABSL_FLAG(double, router_prefill_weight, duet::coordinator::RouterWeights{}.prefill,
          "cache_aware: cost per prompt of tokens the prefill node must compute (those it does "
          "not hold cached)");
ABSL_FLAG(double, router_queue_weight, duet::coordinator::RouterWeights{}.queue,
          "cache_aware: cost per prompt of tokens queued on the prefill node");
ABSL_FLAG(double, router_transfer_weight, duet::coordinator::RouterWeights{}.transfer,
          "cache_aware: cost per prompt of KV blocks the decode node must receive (those it does "
          "not hold cached)");
ABSL_FLAG(double, router_decode_weight, duet::coordinator::RouterWeights{}.decode,
          "cache_aware: cost of a full decode batch (running / max_running)");

namespace duet::cli {

std::vector<FlagGroupInfo> CoordinatorFlagGroups() {
  return {{FlagGroup::kRouting,
           "routing",
           "coordinator: membership, queueing and routing",
           {&absl::GetFlagReflectionHandle(FLAGS_heartbeat_timeout_ms),
            &absl::GetFlagReflectionHandle(FLAGS_queue_timeout_ms),
            &absl::GetFlagReflectionHandle(FLAGS_max_resumes),
            &absl::GetFlagReflectionHandle(FLAGS_router),
            &absl::GetFlagReflectionHandle(FLAGS_router_prefill_weight),
            &absl::GetFlagReflectionHandle(FLAGS_router_queue_weight),
            &absl::GetFlagReflectionHandle(FLAGS_router_transfer_weight),
            &absl::GetFlagReflectionHandle(FLAGS_router_decode_weight)}}};
}

absl::StatusOr<RoutingFlags> ReadRoutingFlags() {
  const int64_t heartbeat_ms = absl::GetFlag(FLAGS_heartbeat_timeout_ms);
  const int64_t queue_ms = absl::GetFlag(FLAGS_queue_timeout_ms);
  const int32_t max_resumes = absl::GetFlag(FLAGS_max_resumes);
  if (heartbeat_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--heartbeat-timeout-ms (", heartbeat_ms, ") must be > 0"));
  }
  if (queue_ms < 0 || max_resumes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--queue-timeout-ms (", queue_ms, ") and --max-resumes (", max_resumes, ") must be >= 0"));
  }
  auto router = FlagValue("router", coordinator::ParseRouterMode(absl::GetFlag(FLAGS_router)));
  if (!router.ok()) return router.status();
  return RoutingFlags{.heartbeat_timeout = absl::Milliseconds(heartbeat_ms),
                      .queue_timeout = absl::Milliseconds(queue_ms),
                      .max_resumes = max_resumes,
                      .router = *router,
                      .router_weights = {.prefill = absl::GetFlag(FLAGS_router_prefill_weight),
                                         .queue = absl::GetFlag(FLAGS_router_queue_weight),
                                         .transfer = absl::GetFlag(FLAGS_router_transfer_weight),
                                         .decode = absl::GetFlag(FLAGS_router_decode_weight)}};
}

}  // namespace duet::cli
