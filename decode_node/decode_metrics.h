// DecodeMetrics: a decode node's Prometheus metrics (duet_decode_*): tokens generated, requests
// finished by reason, per-layer KV arrival latency (layer computed on P -> landed here) and
// admission delay from each admitted request, and gauges over the KV pool (free, used,
// quarantined), quarantine past its bound, and the scheduler (running, pending admission,
// queued tokens) read at scrape.
//
//   DecodeMetrics m(&registry);
//   m.AddNodeGauges([&] { return pool->Stats(); }, [&] { return scheduler->Load(); });
//   m.OnEvent(event);   // for each DecodeEvent streamed to the coordinator
#pragma once

#include <functional>

#include "common/kv/block_pool.h"
#include "common/metrics/metrics.h"
#include "decode_node/decode_scheduler.h"

namespace duet::decode {

class DecodeMetrics {
 public:
  explicit DecodeMetrics(metrics::Registry* registry);
  void AddNodeGauges(std::function<kv::BlockPoolStats()> pool, std::function<SchedulerLoad()> load);
  // duet_decode_kv_quarantined_overdue_blocks (blocks quarantined longer than the bound) and
  // duet_decode_kv_fenced_senders.
  void AddQuarantineGauges(std::function<QuarantineStats()> stats);
  // duet_decode_unclaimed_reservations_released_total (DecodeScheduler::unclaimed_released).
  void AddUnclaimedCounter(std::function<int64_t()> released);
  void OnEvent(const DecodeEvent& ev);
  // A token stream that ended without a finishing event (client gone, shutdown).
  void OnStreamDropped() { dropped_.Increment(); }

 private:
  metrics::Registry* const registry_;
  metrics::Counter& tokens_;
  metrics::Family<metrics::Counter>& finished_;
  metrics::Counter& dropped_;
  metrics::Counter& admitted_;
  metrics::Histogram& layer_arrival_;
  metrics::Histogram& transfer_tail_;
  metrics::Histogram& admission_;
};

}  // namespace duet::decode
