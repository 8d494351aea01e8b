#include "colocated/colocated_metrics.h"

#include <utility>
#include <vector>

#include "common/kv/pool_gauges.h"
#include "common/metrics/outcome.h"

namespace duet::colocated {

ColocatedMetrics::ColocatedMetrics(metrics::Registry* registry)
    : registry_(registry),
      requests_(registry->AddCounter("duet_colocated_requests_total",
                                     "Generation requests by outcome", {"outcome"})),
      tokens_(registry
                  ->AddCounter("duet_colocated_generated_tokens_total",
                               "Tokens sampled and streamed to clients", {})
                  .WithLabels({})) {
  // Outcomes that exist before the first request, so rates start from zero.
  for (const char* o : {"ok", "cancelled"}) requests_.WithLabels({o});
}

void ColocatedMetrics::AddServerGauges(std::function<kv::BlockPoolStats()> pool,
                                       std::function<ColocatedLoad()> load) {
  kv::AddBlockPoolGauge(registry_, "duet_colocated_kv_blocks", "The KV pool by state",
                        std::move(pool));
  registry_->AddGaugeCallback("duet_colocated_queue",
                              "Requests waiting for admission, running, queued prompt tokens",
                              {"what"}, [load] {
                                const ColocatedLoad l = load();
                                return std::vector<metrics::Sample>{
                                    {{"waiting_requests"}, static_cast<double>(l.waiting_requests)},
                                    {{"running_requests"}, static_cast<double>(l.running_requests)},
                                    {{"queued_tokens"}, static_cast<double>(l.queued_tokens)}};
                              });
  registry_->AddCounterCallback(
      "duet_colocated_preemptions_total",
      "Running requests sent back to the queue for want of KV blocks (resumed by recompute)", {},
      [load] {
        return std::vector<metrics::Sample>{{{}, static_cast<double>(load().preemptions)}};
      });
}

void ColocatedMetrics::RecordRequest(const absl::Status& status) {
  requests_.WithLabels({metrics::OutcomeLabel(status)}).Increment();
}

}  // namespace duet::colocated
