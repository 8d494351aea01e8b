// PrefillMetrics: a prefill node's Prometheus metrics (duet_prefill_*): Prefill calls by
// outcome, prompt tokens, KV bytes streamed to decode nodes, per-layer transfer latency
// (layer computed -> its write landed), transfer tail and compute histograms, transfer errors;
// pool and queue gauges, and the compute stopped requests cost, are read from the node at
// scrape time.
//
//   PrefillMetrics m(&registry, layout);
//   m.RecordPrefill(status, prompt_tokens, remote_blocks, ok ? &response : nullptr);
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "common/kv/block_pool.h"
#include "common/kv/kv_layout.h"
#include "common/metrics/metrics.h"
#include "duet/v1/prefill.pb.h"
#include "prefill_node/prefill_scheduler.h"

namespace duet::prefill {

class PrefillMetrics {
 public:
  PrefillMetrics(metrics::Registry* registry, const kv::KvLayout& layout);
  // Gauges and counters over the node's pool and scheduler, read when /metrics is scraped.
  void AddNodeGauges(std::function<kv::BlockPoolStats()> pool, std::function<PrefillLoad()> load,
                     std::function<PrefillStopCounters()> stops);
  void RecordPrefill(const absl::Status& status, int64_t prompt_tokens, int64_t remote_blocks,
                     const v1::PrefillResponse* response);

 private:
  metrics::Registry* const registry_;
  const kv::KvLayout layout_;
  metrics::Family<metrics::Counter>& requests_;
  metrics::Counter& prompt_tokens_;
  metrics::Counter& kv_bytes_;
  metrics::Counter& transfer_errors_;
  metrics::Histogram& layer_transfer_;
  metrics::Histogram& transfer_tail_;
  metrics::Histogram& compute_;
};

}  // namespace duet::prefill
