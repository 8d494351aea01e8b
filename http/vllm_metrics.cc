#include "http/vllm_metrics.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/time/clock.h"

namespace duet::http {
namespace {

metrics::Histogram& Hist(metrics::Registry* r, const std::string& name, const std::string& help,
                         const std::string& model) {
  return r->AddHistogram(name, help, {"model_name"}, metrics::LatencyBuckets()).WithLabels({model});
}

metrics::Counter& Count(metrics::Registry* r, const std::string& name, const std::string& help,
                        const std::string& model) {
  return r->AddCounter(name, help, {"model_name"}).WithLabels({model});
}

// vLLM's buckets for token counts: 1, 2, 5, 10, 20, 50, ... up to 10^7.
metrics::Histogram& TokenHist(metrics::Registry* r, const std::string& name,
                              const std::string& help, const std::string& model) {
  std::vector<double> bounds;
  for (double scale = 1; scale <= 1e7; scale *= 10) {
    for (double m : {1.0, 2.0, 5.0}) bounds.push_back(m * scale);
  }
  return r->AddHistogram(name, help, {"model_name"}, bounds).WithLabels({model});
}

}  // namespace

VllmMetrics::VllmMetrics(metrics::Registry* registry, std::string model_name,
                         std::function<v1::HealthResponse()> health)
    : model_(std::move(model_name)),
      prompt_tokens_(Count(registry, "vllm:prompt_tokens_total",
                           "Prompt tokens of the HTTP API's requests", model_)),
      generation_tokens_(Count(registry, "vllm:generation_tokens_total",
                               "Tokens generated for the HTTP API's requests", model_)),
      success_(registry->AddCounter("vllm:request_success_total",
                                    "HTTP API requests that ended, by finish reason",
                                    {"model_name", "finished_reason"})),
      ttft_(Hist(registry, "vllm:time_to_first_token_seconds", "Request arrival to its first token",
                 model_)),
      itl_(Hist(registry, "vllm:inter_token_latency_seconds",
                "Time between consecutive tokens of a request", model_)),
      tpot_(Hist(registry, "vllm:time_per_output_token_seconds",
                 "Mean time per output token after the first, per request", model_)),
      e2e_(
          Hist(registry, "vllm:e2e_request_latency_seconds", "Request arrival to its end", model_)),
      queue_(Hist(registry, "vllm:request_queue_time_seconds",
                  "Request arrival to the start of its prefill (queue, routing, reserve)", model_)),
      prefill_(Hist(registry, "vllm:request_prefill_time_seconds",
                    "Start of the prefill to the first token", model_)),
      decode_(Hist(registry, "vllm:request_decode_time_seconds", "First token to the request's end",
                   model_)),
      request_prompt_tokens_(TokenHist(registry, "vllm:request_prompt_tokens",
                                       "Prompt tokens of each request that ended", model_)),
      request_generation_tokens_(TokenHist(registry, "vllm:request_generation_tokens",
                                           "Tokens generated for each request that ended", model_)),
      prefix_cache_queries_(Count(registry, "vllm:prefix_cache_queries_total",
                                  "Prompt tokens looked up in a prefix cache", model_)),
      prefix_cache_hits_(Count(registry, "vllm:prefix_cache_hits_total",
                               "Prompt tokens taken from a prefix cache", model_)),
      preemptions_(Count(registry, "vllm:num_preemptions_total",
                         "Times a request gave its KV blocks up and was computed again", model_)) {
  for (const char* r : {"stop", "length", "abort"}) success_.WithLabels({model_, r});
  registry->AddGaugeCallback(
      "vllm:num_requests_running", "HTTP API requests in a batch (prefilling or decoding)",
      {"model_name"}, [this] {
        return std::vector<metrics::Sample>{{{model_}, static_cast<double>(running_.load())}};
      });
  registry->AddGaugeCallback(
      "vllm:num_requests_waiting",
      "HTTP API requests admitted and not in a batch (queued, preempted)", {"model_name"}, [this] {
        return std::vector<metrics::Sample>{{{model_}, static_cast<double>(waiting_.load())}};
      });
  registry->AddGaugeCallback(
      "vllm:kv_cache_usage_perc",
      "Share of the decode nodes' KV blocks in use (1 = full), as their heartbeats report",
      {"model_name"}, [this, health = std::move(health)] {
        const v1::HealthResponse h = health();
        double used = 0, total = 0;
        for (const v1::NodeStatus& n : h.nodes()) {
          if (n.kind() != v1::NODE_KIND_DECODE) continue;
          total += static_cast<double>(n.load().total_blocks());
          used += static_cast<double>(n.load().total_blocks() - n.load().free_blocks());
        }
        if (total <= 0) return std::vector<metrics::Sample>{};  // no decode pool known: no sample
        return std::vector<metrics::Sample>{{{model_}, used / total}};
      });
}

VllmMetrics::Request::Request(VllmMetrics* m) : m_(m), start_(absl::Now()) {
  m_->waiting_.fetch_add(1);
}

VllmMetrics::Request::Request(Request&& o) noexcept
    : m_(o.m_),
      start_(o.start_),
      first_(o.first_),
      last_(o.last_),
      tokens_(o.tokens_),
      running_(o.running_),
      done_(o.done_) {
  o.done_ = true;
}

VllmMetrics::Request::~Request() {
  if (!done_) Finish(0, "abort", nullptr);
}

void VllmMetrics::Request::OnScheduled(bool running) {
  if (done_ || running == running_) return;
  running_ = running;
  (running ? m_->waiting_ : m_->running_).fetch_sub(1);
  (running ? m_->running_ : m_->waiting_).fetch_add(1);
}

void VllmMetrics::Request::OnToken(absl::Time at) {
  if (done_) return;
  // A token is sampled in a batch (a backend that does not say when it schedules).
  OnScheduled(true);
  if (tokens_ == 0) {
    first_ = at;
    m_->ttft_.Observe(absl::ToDoubleSeconds(at - start_));
  } else {
    m_->itl_.Observe(absl::ToDoubleSeconds(at - last_));
  }
  last_ = at;
  ++tokens_;
  m_->generation_tokens_.Increment();
}

void VllmMetrics::Request::Finish(int64_t prompt_tokens, const std::string& finished_reason,
                                  const v1::RequestTimings* timings) {
  if (done_) return;
  done_ = true;
  (running_ ? m_->running_ : m_->waiting_).fetch_sub(1);
  const absl::Time end = absl::Now();
  m_->prompt_tokens_.Increment(static_cast<double>(prompt_tokens));
  m_->success_.WithLabels({m_->model_, finished_reason}).Increment();
  m_->e2e_.Observe(absl::ToDoubleSeconds(end - start_));
  m_->request_prompt_tokens_.Observe(static_cast<double>(prompt_tokens));
  m_->request_generation_tokens_.Observe(static_cast<double>(tokens_));
  if (timings != nullptr) {
    // A prompt the cluster prefilled was looked up in a prefix cache (scored prompts too: they
    // take nothing from it, and count as queried).
    if (timings->prefill_attempts() > 0 || tokens_ > 0) {
      m_->prefix_cache_queries_.Increment(static_cast<double>(prompt_tokens));
      m_->prefix_cache_hits_.Increment(static_cast<double>(timings->prefill_cached_tokens()));
    }
    m_->preemptions_.Increment(static_cast<double>(timings->resumes()));
  }
  if (tokens_ > 1) {
    m_->tpot_.Observe(absl::ToDoubleSeconds(last_ - first_) / static_cast<double>(tokens_ - 1));
  }
  if (timings != nullptr && tokens_ > 0) {
    const double queue = static_cast<double>(timings->queue_us()) / 1e6;
    m_->queue_.Observe(queue);
    m_->prefill_.Observe(std::max(0.0, absl::ToDoubleSeconds(first_ - start_) - queue));
    m_->decode_.Observe(static_cast<double>(timings->decode_us()) / 1e6);
  }
}

}  // namespace duet::http
