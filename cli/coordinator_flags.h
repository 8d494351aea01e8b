// The coordinator and routing flag group (flag_groups.h) of `duet coordinator` (and of `duet
// serve --loopback`, which hands it to its coordinator), read into typed options: durations as
// absl::Duration, the router as coordinator::RouterMode.
//
//   absl::StatusOr<RoutingFlags> r = ReadRoutingFlags();  // refuses --router=fast by name
//   options.router = r->router;  // coordinator::CoordinatorOptions takes the mode
#pragma once

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/router.h"

namespace duet::cli {

struct RoutingFlags {
  absl::Duration heartbeat_timeout;  // --heartbeat-timeout-ms
  absl::Duration queue_timeout;      // --queue-timeout-ms
  int max_resumes = 0;
  coordinator::RouterMode router = coordinator::RouterMode::kCacheAware;
  coordinator::RouterWeights router_weights;
};

// INVALID_ARGUMENT naming the flag for an unknown --router, a negative --queue-timeout-ms or
// --max-resumes, or a non-positive --heartbeat-timeout-ms.
absl::StatusOr<RoutingFlags> ReadRoutingFlags();

}  // namespace duet::cli
