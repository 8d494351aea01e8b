// The flag groups of `duet serve` (flag_groups.h), read into typed options: its mode, port and
// node metrics (--loopback and --colocated), and the --loopback supervisor's node counts,
// start-up deadline and restarts.
//
//   ServeFlags s = ReadServeFlags();            // s.port, s.node_metrics
//   SupervisorFlags v = ReadSupervisorFlags();  // v.prefill, v.decode, v.ready_timeout, ...
#pragma once

#include "absl/time/time.h"

namespace duet::cli {

struct ServeFlags {
  int port = 0;  // the client port (0: any free port)
  bool node_metrics = false;
};

struct SupervisorFlags {
  int prefill = 1;  // nodes of each kind
  int decode = 1;
  absl::Duration ready_timeout;  // --ready-timeout-s
  bool restart = true;           // --no-restart: false
  int restart_limit = 0;         // restarts of each child at most
};

ServeFlags ReadServeFlags();
SupervisorFlags ReadSupervisorFlags();

}  // namespace duet::cli
