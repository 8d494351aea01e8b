// Prometheus-style metrics without dependencies: Counter, Gauge and Histogram (fixed buckets),
// grouped in labelled families held by a Registry that renders the text exposition format
// 0.0.4. Updates are lock-free atomics (cheap on the hot path); looking up a labelled child
// takes the family's lock once, so keep the returned reference.
//
//   metrics::Registry reg;
//   metrics::Counter& ok = reg.AddCounter("duet_requests_total", "Requests by outcome",
//                                         {"outcome"}).WithLabels({"ok"});
//   ok.Increment();
//   metrics::Histogram& ttft = reg.AddHistogram("duet_ttft_seconds", "Time to first token", {},
//                                               metrics::LatencyBuckets()).WithLabels({});
//   ttft.Observe(0.083);
//   reg.AddGaugeCallback("duet_kv_blocks", "KV blocks by state", {"state"},
//                        [&] { return std::vector<metrics::Sample>{{{"free"}, 12}}; });
//   std::string text = reg.Render();   // "# HELP duet_requests_total ...\n# TYPE ..."
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace duet::metrics {

using LabelValues = std::vector<std::string>;

class Counter {
 public:
  void Increment(double v = 1) { value_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // bounds: strictly increasing upper bounds; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  // Per-bucket (not cumulative) counts; the last is the +Inf bucket.
  std::vector<uint64_t> BucketCounts() const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

// Seconds from 1 ms to 60 s, for request latencies.
std::vector<double> LatencyBuckets();
// Seconds from 10 µs to 1 s, for per-layer transfers.
std::vector<double> FastLatencyBuckets();

// A family: one metric name, a fixed set of label names, one child per label-value tuple.
template <typename T>
class Family {
 public:
  Family(std::vector<std::string> label_names, std::function<std::unique_ptr<T>()> make)
      : label_names_(std::move(label_names)), make_(std::move(make)) {}
  // values.size() must equal the number of label names (extra are dropped, missing are "").
  T& WithLabels(LabelValues values) {
    values.resize(label_names_.size());
    absl::MutexLock lock(&mu_);
    std::unique_ptr<T>& c = children_[values];
    if (c == nullptr) c = make_();
    return *c;
  }
  const std::vector<std::string>& label_names() const { return label_names_; }
  template <typename Fn>
  void ForEach(Fn fn) const {
    absl::MutexLock lock(&mu_);
    for (const auto& [values, child] : children_) fn(values, *child);
  }

 private:
  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<T>()> make_;
  mutable absl::Mutex mu_;
  std::map<LabelValues, std::unique_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

// One sample of a callback gauge.
struct Sample {
  LabelValues labels;
  double value = 0;
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Adding a name twice returns the first family (the kind and labels must agree).
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              std::vector<std::string> label_names);
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          std::vector<std::string> label_names);
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names, std::vector<double> bounds);
  // A gauge read at render time (pool occupancy, queue lengths held elsewhere).
  void AddGaugeCallback(const std::string& name, const std::string& help,
                        std::vector<std::string> label_names,
                        std::function<std::vector<Sample>()> fn);
  // A counter kept elsewhere (monotonic), read at render time.
  void AddCounterCallback(const std::string& name, const std::string& help,
                          std::vector<std::string> label_names,
                          std::function<std::vector<Sample>()> fn);

  // Text exposition format 0.0.4, families in name order.
  std::string Render() const;

 private:
  struct Entry {
    std::string help;
    std::string type;  // counter, gauge, histogram
    std::unique_ptr<Family<Counter>> counter;
    std::unique_ptr<Family<Gauge>> gauge;
    std::unique_ptr<Family<Histogram>> histogram;
    std::vector<std::string> callback_labels;
    std::function<std::vector<Sample>()> callback;
  };
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

// Exposed for tests: label-value and HELP escaping, number formatting.
std::string EscapeLabelValue(const std::string& v);
std::string FormatValue(double v);

}  // namespace duet::metrics
