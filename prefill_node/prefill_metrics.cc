#include "prefill_node/prefill_metrics.h"

#include <utility>
#include <vector>

#include "common/kv/pool_gauges.h"
#include "common/metrics/outcome.h"

namespace duet::prefill {

PrefillMetrics::PrefillMetrics(metrics::Registry* registry, const kv::KvLayout& layout)
    : registry_(registry),
      layout_(layout),
      requests_(registry->AddCounter("duet_prefill_requests_total", "Prefill calls by outcome",
                                     {"outcome"})),
      prompt_tokens_(registry
                         ->AddCounter("duet_prefill_prompt_tokens_total",
                                      "Prompt tokens prefilled (successful calls)", {})
                         .WithLabels({})),
      kv_bytes_(registry
                    ->AddCounter("duet_prefill_kv_transfer_bytes_total",
                                 "KV bytes written into decode nodes' blocks", {})
                    .WithLabels({})),
      transfer_errors_(registry
                           ->AddCounter("duet_prefill_transfer_errors_total",
                                        "Prefill calls that failed on the KV transfer or its "
                                        "peer (unavailable, aborted, deadline)",
                                        {})
                           .WithLabels({})),
      layer_transfer_(registry
                          ->AddHistogram("duet_prefill_layer_transfer_seconds",
                                         "Per layer: K/V computed -> its write landed on D", {},
                                         metrics::FastLatencyBuckets())
                          .WithLabels({})),
      transfer_tail_(registry
                         ->AddHistogram("duet_prefill_transfer_tail_seconds",
                                        "Last layer computed -> every write landed", {},
                                        metrics::FastLatencyBuckets())
                         .WithLabels({})),
      compute_(registry
                   ->AddHistogram("duet_prefill_compute_seconds",
                                  "Forward-pass time holding the prompt", {},
                                  metrics::LatencyBuckets())
                   .WithLabels({})) {
  requests_.WithLabels({"ok"});
}

void PrefillMetrics::AddNodeGauges(std::function<kv::BlockPoolStats()> pool,
                                   std::function<PrefillLoad()> load,
                                   std::function<PrefillStopCounters()> stops) {
  kv::AddBlockPoolGauge(registry_, "duet_prefill_kv_blocks", "The prefill node's KV pool by state",
                        std::move(pool));
  registry_->AddGaugeCallback(
      "duet_prefill_queue",
      "Queued prompt tokens, running requests, and prompts waiting for room in the KV pool",
      {"what"}, [load] {
        const PrefillLoad l = load();
        return std::vector<metrics::Sample>{
            {{"queued_tokens"}, static_cast<double>(l.queued_tokens)},
            {{"running_requests"}, static_cast<double>(l.running_requests)},
            {{"waiting_for_room"}, static_cast<double>(l.waiting_for_room)}};
      });
  registry_->AddCounterCallback(
      "duet_prefill_compute_after_stop_seconds_total",
      "Forward-pass time spent on requests after they were cancelled or expired", {}, [stops] {
        return std::vector<metrics::Sample>{
            {{}, static_cast<double>(stops().compute_after_stop_us) * 1e-6}};
      });
  registry_->AddCounterCallback(
      "duet_prefill_requests_stopped_in_pass_total",
      "Requests cancelled or expired while a forward pass computed them", {}, [stops] {
        return std::vector<metrics::Sample>{{{}, static_cast<double>(stops().stopped_in_pass)}};
      });
  registry_->AddCounterCallback(
      "duet_prefill_passes_abandoned_total",
      "Forward passes cut short at a layer because every request in them stopped", {}, [stops] {
        return std::vector<metrics::Sample>{{{}, static_cast<double>(stops().passes_abandoned)}};
      });
}

void PrefillMetrics::RecordPrefill(const absl::Status& status, int64_t prompt_tokens,
                                   int64_t remote_blocks, const v1::PrefillResponse* response) {
  requests_.WithLabels({metrics::OutcomeLabel(status)}).Increment();
  if (status.code() == absl::StatusCode::kUnavailable ||
      status.code() == absl::StatusCode::kAborted ||
      status.code() == absl::StatusCode::kDeadlineExceeded) {
    transfer_errors_.Increment();
  }
  if (!status.ok() || response == nullptr) return;
  prompt_tokens_.Increment(static_cast<double>(prompt_tokens));
  kv_bytes_.Increment(static_cast<double>(remote_blocks) * layout_.num_layers *
                      static_cast<double>(layout_.BlockBytes()));
  for (int64_t us : response->layer_transfer_us()) layer_transfer_.Observe(us * 1e-6);
  transfer_tail_.Observe(response->transfer_tail_us() * 1e-6);
  compute_.Observe(response->prefill_compute_us() * 1e-6);
}

}  // namespace duet::prefill
