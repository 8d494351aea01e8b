// ColocatedMetrics: the colocated server's Prometheus metrics (duet_colocated_*), served on
// --metrics_port like a node's: requests by outcome, tokens generated, and gauges read at
// scrape over the scheduler (waiting and running requests, queued prompt tokens, preemptions) and
// the KV pool (free, used, quarantined, total).
//
//   metrics::Registry registry;
//   ColocatedMetrics m(&registry);
//   m.AddServerGauges([&] { return pool->Stats(); }, [&] { return scheduler->Load(); });
//   m.OnToken();                 // each token streamed to a client
//   m.RecordRequest(status);     // each Generate's final status
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "colocated/colocated_scheduler.h"
#include "common/kv/block_pool.h"
#include "common/metrics/metrics.h"

namespace duet::colocated {

class ColocatedMetrics {
 public:
  explicit ColocatedMetrics(metrics::Registry* registry);
  // What `pool` and `load` read must outlive the registry's exporter.
  void AddServerGauges(std::function<kv::BlockPoolStats()> pool,
                       std::function<ColocatedLoad()> load);
  void RecordRequest(const absl::Status& status);
  void OnToken() { tokens_.Increment(); }

 private:
  metrics::Registry* const registry_;
  metrics::Family<metrics::Counter>& requests_;
  metrics::Counter& tokens_;
};

}  // namespace duet::colocated
