#include "decode_node/decode_metrics.h"

#include <utility>
#include <vector>

#include "common/kv/pool_gauges.h"

namespace duet::decode {

DecodeMetrics::DecodeMetrics(metrics::Registry* registry)
    : registry_(registry),
      tokens_(registry
                  ->AddCounter("duet_decode_generated_tokens_total",
                               "Tokens sampled on this decode node", {})
                  .WithLabels({})),
      finished_(registry->AddCounter("duet_decode_requests_finished_total",
                                     "Requests that ended on this node, by finish reason",
                                     {"reason"})),
      dropped_(registry
                   ->AddCounter("duet_decode_streams_dropped_total",
                                "Token streams whose reader left before the end", {})
                   .WithLabels({})),
      admitted_(registry
                    ->AddCounter("duet_decode_requests_admitted_total",
                                 "Requests whose KV landed and joined the batch", {})
                    .WithLabels({})),
      layer_arrival_(registry
                         ->AddHistogram("duet_decode_layer_transfer_seconds",
                                        "Per layer: K/V computed on P -> landed here", {},
                                        metrics::FastLatencyBuckets())
                         .WithLabels({})),
      transfer_tail_(registry
                         ->AddHistogram("duet_decode_transfer_tail_seconds",
                                        "Last layer computed on P -> all KV landed here", {},
                                        metrics::FastLatencyBuckets())
                         .WithLabels({})),
      admission_(registry
                     ->AddHistogram("duet_decode_admission_seconds",
                                    "KV landed -> joined the running batch", {},
                                    metrics::FastLatencyBuckets())
                     .WithLabels({})) {}

void DecodeMetrics::AddNodeGauges(std::function<kv::BlockPoolStats()> pool,
                                  std::function<SchedulerLoad()> load) {
  kv::AddBlockPoolGauge(registry_, "duet_decode_kv_blocks", "The decode node's KV pool by state",
                        std::move(pool));
  registry_->AddGaugeCallback("duet_decode_queue",
                              "Running requests, requests pending admission, queued tokens",
                              {"what"}, [load] {
                                const SchedulerLoad l = load();
                                return std::vector<metrics::Sample>{
                                    {{"running_requests"}, static_cast<double>(l.running_requests)},
                                    {{"pending_requests"}, static_cast<double>(l.pending_requests)},
                                    {{"queued_tokens"}, static_cast<double>(l.queued_tokens)}};
                              });
}

void DecodeMetrics::AddQuarantineGauges(std::function<QuarantineStats()> stats) {
  registry_->AddGaugeCallback(
      "duet_decode_kv_quarantined_overdue_blocks",
      "KV blocks quarantined for longer than --kv_quarantine_bound (their prefill node was "
      "fenced but its writes could not be revoked, or the fence is under way)",
      {}, [stats] {
        return std::vector<metrics::Sample>{{{}, static_cast<double>(stats().overdue_blocks)}};
      });
  registry_->AddGaugeCallback(
      "duet_decode_kv_fenced_senders",
      "Prefill nodes this node has fenced now (one did not confirm an abandoned transfer quiet in "
      "time; the fence lifts once it confirms every such transfer, or its endpoint is lost)",
      {}, [stats] {
        return std::vector<metrics::Sample>{{{}, static_cast<double>(stats().fenced_senders)}};
      });
}

void DecodeMetrics::AddUnclaimedCounter(std::function<int64_t()> released) {
  registry_->AddCounterCallback(
      "duet_decode_unclaimed_reservations_released_total",
      "Reservations released because no token stream was opened for them in time (their "
      "coordinator died between Reserve and StreamTokens)",
      {}, [released] {
        return std::vector<metrics::Sample>{{{}, static_cast<double>(released())}};
      });
}

void DecodeMetrics::OnEvent(const DecodeEvent& ev) {
  if (ev.admitted) {
    admitted_.Increment();
    for (int64_t us : ev.layer_transfer_us) layer_arrival_.Observe(us * 1e-6);
    transfer_tail_.Observe(ev.transfer_tail_us * 1e-6);
    admission_.Observe(ev.decode_admission_us * 1e-6);
  }
  if (ev.has_token) tokens_.Increment();
  if (ev.finished()) finished_.WithLabels({FinishReasonName(ev.finish)}).Increment();
}

}  // namespace duet::decode
