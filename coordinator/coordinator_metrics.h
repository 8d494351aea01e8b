// The coordinator's metrics (Prometheus names duet_coordinator_*): requests by outcome, TTFT,
// TPOT and end-to-end latency histograms, requests in flight, node heartbeats and deaths, the
// coordinator's own stalls, routing decisions by reason (RouteReasonName), resumes on another
// decode node by cause, requests waiting for room, re-routes away from unresponsive nodes, the
// nodes' status streams (snapshots received, breaks). The
// node-load and index gauges are callbacks the server registers over its NodeRegistry and
// PrefixIndex.
//
//   CoordinatorMetrics m;
//   m.RecordRequest(status, start, first_token_at, last_token_at, tokens);
//   std::string text = m.registry.Render();
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"

namespace duet::coordinator {

struct CoordinatorMetrics {
  CoordinatorMetrics();

  // first/last are InfinitePast when no token was sent.
  void RecordRequest(const absl::Status& s, absl::Time start, absl::Time first, absl::Time last,
                     int64_t tokens);

  metrics::Registry registry;
  metrics::Family<metrics::Counter>& requests;
  metrics::Histogram& ttft;
  metrics::Histogram& tpot;
  metrics::Histogram& e2e;
  metrics::Counter& generated_tokens;
  metrics::Gauge& active;
  metrics::Family<metrics::Counter>& heartbeats;
  metrics::Counter& node_deaths;
  // The coordinator's own stalls (timer ticks late by more than max_tick_gap), not counted as
  // node silence.
  metrics::Counter& stalled_seconds;
  metrics::Family<metrics::Counter>& routing_decisions;  // {reason}
  metrics::Counter& prompt_blocks_cached;  // prompt blocks the chosen D held (not sent)
  // Requests continued on another decode node, by cause (preempted, decode_lost).
  metrics::Family<metrics::Counter>& resumes;
  metrics::Gauge& waiting;  // requests waiting for a node with room
  // Routing hops away from a node that did not answer (suspect_decode, unreachable_prefill).
  metrics::Family<metrics::Counter>& reroutes;
  // The nodes' status streams, per node: snapshots applied (one per stream opened), breaks.
  metrics::Family<metrics::Counter>& status_snapshots;
  metrics::Family<metrics::Counter>& status_stream_breaks;
  // Nodes announced on etcd that registration refused (another layout, compute or seed).
  metrics::Counter& etcd_refused_nodes;
};

}  // namespace duet::coordinator
