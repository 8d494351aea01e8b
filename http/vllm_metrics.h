// VllmMetrics: the OpenAI API's requests in the Prometheus series vLLM exports, under vLLM's names
// and its `model_name` label, so that a dashboard built for vLLM reads duet unchanged. Beside
// duet's own series (same registry, same /metrics), not instead of them. What each counts here:
//   vllm:num_requests_running   HTTP requests a scheduler has taken into a batch (prefilling
//                               or decoding: GenerateSink::scheduled, or a first token)
//   vllm:num_requests_waiting   HTTP requests admitted and not in a batch (queued at the
//                               coordinator or in a prefill node's or the colocated server's
//                               queue, preempted, being re-routed)
//   vllm:kv_cache_usage_perc    used / total KV blocks over the decode nodes (the colocated
//                               server's own pool), 0..1, from the backend's Health at scrape
//   vllm:prompt_tokens_total, vllm:generation_tokens_total,
//   vllm:request_success_total{finished_reason} vllm:time_to_first_token_seconds,
//   vllm:inter_token_latency_seconds (each token after the first),
//   vllm:time_per_output_token_seconds (per request), vllm:e2e_request_latency_seconds,
//   vllm:request_queue_time_seconds (RequestTimings.queue_us), vllm:request_prefill_time_seconds
//   (first token minus queue time), vllm:request_decode_time_seconds (RequestTimings.decode_us),
//   vllm:request_prompt_tokens and vllm:request_generation_tokens (per request, vLLM's 1-2-5
//   buckets), vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total (prompt tokens
//   looked up / taken from a prefix cache: RequestTimings.prefill_cached_tokens),
//   vllm:num_preemptions_total (RequestTimings.resumes: a decode node's, or the colocated
//   server's, preemptions).
// Requests served over gRPC are in duet_coordinator_* only.
//
//   VllmMetrics m(&registry, "smollm2", [&] { return backend->Health(); });
//   VllmMetrics::Request r = m.Start();
//   r.OnScheduled(true);  r.OnToken(absl::Now());  ...  r.Finish(prompt_tokens, "stop", &timings);
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "duet/v1/client.pb.h"

namespace duet::http {

class VllmMetrics {
 public:
  VllmMetrics(metrics::Registry* registry, std::string model_name,
              std::function<v1::HealthResponse()> health);

  // One request, from admission to its end. Counts as waiting until a scheduler takes it (or
  // its first token), then as running, back to waiting while preempted, until Finish or
  // destruction.
  class Request {
   public:
    Request(Request&& o) noexcept;
    Request& operator=(Request&&) = delete;
    ~Request();
    // In a batch (true) or back to waiting (false).
    void OnScheduled(bool running);
    void OnToken(absl::Time at);
    // `finished_reason`: "stop", "length" or "abort" (vLLM's labels); timings may be null.
    void Finish(int64_t prompt_tokens, const std::string& finished_reason,
                const v1::RequestTimings* timings);

   private:
    friend class VllmMetrics;
    explicit Request(VllmMetrics* m);
    VllmMetrics* m_;
    absl::Time start_;
    absl::Time first_ = absl::InfinitePast(), last_ = absl::InfinitePast();
    int64_t tokens_ = 0;
    bool running_ = false;
    bool done_ = false;
  };

  Request Start() { return Request(this); }

 private:
  const std::string model_;
  std::atomic<int64_t> waiting_{0}, running_{0};
  metrics::Counter& prompt_tokens_;
  metrics::Counter& generation_tokens_;
  metrics::Family<metrics::Counter>& success_;
  metrics::Histogram& ttft_;
  metrics::Histogram& itl_;
  metrics::Histogram& tpot_;
  metrics::Histogram& e2e_;
  metrics::Histogram& queue_;
  metrics::Histogram& prefill_;
  metrics::Histogram& decode_;
  metrics::Histogram& request_prompt_tokens_;
  metrics::Histogram& request_generation_tokens_;
  metrics::Counter& prefix_cache_queries_;
  metrics::Counter& prefix_cache_hits_;
  metrics::Counter& preemptions_;
};

}  // namespace duet::http
