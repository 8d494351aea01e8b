#include "coordinator/coordinator_metrics.h"

#include "common/metrics/outcome.h"

namespace duet::coordinator {

CoordinatorMetrics::CoordinatorMetrics()
    : requests(registry.AddCounter("duet_coordinator_requests_total",
                                   "Generation requests by outcome", {"outcome"})),
      ttft(registry
               .AddHistogram("duet_coordinator_ttft_seconds",
                             "Time from request arrival to the first token sent", {},
                             metrics::LatencyBuckets())
               .WithLabels({})),
      tpot(registry
               .AddHistogram("duet_coordinator_tpot_seconds",
                             "Mean time per output token after the first, per request", {},
                             metrics::LatencyBuckets())
               .WithLabels({})),
      e2e(registry
              .AddHistogram("duet_coordinator_e2e_seconds", "Time from request arrival to its end",
                            {}, metrics::LatencyBuckets())
              .WithLabels({})),
      generated_tokens(
          registry
              .AddCounter("duet_coordinator_generated_tokens_total", "Tokens sent to clients", {})
              .WithLabels({})),
      active(registry
                 .AddGauge("duet_coordinator_active_requests",
                           "Generation requests in flight (queued, prefilling or decoding)", {})
                 .WithLabels({})),
      heartbeats(registry.AddCounter("duet_coordinator_node_heartbeats_total",
                                     "Heartbeats received per node", {"node"})),
      node_deaths(registry
                      .AddCounter("duet_coordinator_node_deaths_total",
                                  "Nodes declared dead (missed heartbeats) or deregistered", {})
                      .WithLabels({})),
      stalled_seconds(registry
                          .AddCounter("duet_coordinator_stalled_seconds_total",
                                      "Time the coordinator itself did not run (its timer ticked "
                                      "late), not counted as node silence",
                                      {})
                          .WithLabels({})),
      routing_decisions(registry.AddCounter(
          "duet_coordinator_routing_decisions_total",
          "Requests routed, by the prompt blocks the chosen nodes held in their prefix caches "
          "(reason: both, prefill_hit, decode_hit, load = neither; sibling: a later choice of an "
          "n > 1 request sent to its first choice's nodes)",
          {"reason"})),
      prompt_blocks_cached(
          registry
              .AddCounter("duet_coordinator_decode_cached_blocks_total",
                          "Prompt KV blocks the chosen decode node already held (not sent)", {})
              .WithLabels({})),
      resumes(registry.AddCounter(
          "duet_coordinator_request_resumes_total",
          "Requests continued on a decode node from the prompt and the tokens already streamed "
          "(cause: preempted = the decode node had no room to grow it, decode_lost = it died or "
          "its stream broke)",
          {"cause"})),
      waiting(registry
                  .AddGauge("duet_coordinator_waiting_requests",
                            "Requests waiting for a prefill and a decode node with room", {})
                  .WithLabels({})),
      reroutes(registry.AddCounter(
          "duet_coordinator_reroutes_total",
          "Routing hops away from a node that did not answer (suspect_decode: Reserve failed or "
          "timed out; unreachable_prefill: the decode node could not connect to it; "
          "fenced_prefill: "
          "the decode node has it fenced)",
          {"why"})),
      status_snapshots(registry.AddCounter(
          "duet_coordinator_status_snapshots_total",
          "Prefix-cache snapshots applied from a node's status stream (one per stream opened, "
          "one when the stream fell behind the node's window of events)",
          {"node"})),
      status_stream_breaks(registry.AddCounter(
          "duet_coordinator_status_stream_breaks_total",
          "Node status streams that broke or could not be opened (the node is suspect at once)",
          {"node"})),
      etcd_refused_nodes(registry
                             .AddCounter("duet_coordinator_etcd_refused_nodes_total",
                                         "Node announcements on etcd that registration refused "
                                         "(another layout, compute or cache seed)",
                                         {})
                             .WithLabels({})) {
  for (const char* c : {"preempted", "decode_lost"}) resumes.WithLabels({c});
  for (const char* w : {"suspect_decode", "unreachable_prefill", "fenced_prefill"}) {
    reroutes.WithLabels({w});
  }
  // Outcomes that exist before the first request, so rates start from zero.
  for (const char* o : {"ok", "cancelled"}) requests.WithLabels({o});
  for (const char* r : {"both", "prefill_hit", "decode_hit", "load", "sibling"}) {
    routing_decisions.WithLabels({r});
  }
}

void CoordinatorMetrics::RecordRequest(const absl::Status& s, absl::Time start, absl::Time first,
                                       absl::Time last, int64_t tokens) {
  requests.WithLabels({metrics::OutcomeLabel(s)}).Increment();
  const absl::Time now = absl::Now();
  e2e.Observe(absl::ToDoubleSeconds(now - start));
  generated_tokens.Increment(static_cast<double>(tokens));
  if (first != absl::InfinitePast()) ttft.Observe(absl::ToDoubleSeconds(first - start));
  if (tokens > 1) {
    tpot.Observe(absl::ToDoubleSeconds(last - first) / static_cast<double>(tokens - 1));
  }
}

}  // namespace duet::coordinator
