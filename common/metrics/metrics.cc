#include "common/metrics/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace duet::metrics {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = buckets_[i].load(std::memory_order_relaxed);
  return out;
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

std::vector<double> FastLatencyBuckets() {
  return {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.1, 1};
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help,
                                      std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[name];
  if (e.counter == nullptr) {
    e.help = help;
    e.type = "counter";
    e.counter = std::make_unique<Family<Counter>>(std::move(label_names),
                                                  [] { return std::make_unique<Counter>(); });
  }
  return *e.counter;
}

Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[name];
  if (e.gauge == nullptr) {
    e.help = help;
    e.type = "gauge";
    e.gauge = std::make_unique<Family<Gauge>>(std::move(label_names),
                                              [] { return std::make_unique<Gauge>(); });
  }
  return *e.gauge;
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          std::vector<std::string> label_names,
                                          std::vector<double> bounds) {
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[name];
  if (e.histogram == nullptr) {
    e.help = help;
    e.type = "histogram";
    e.histogram = std::make_unique<Family<Histogram>>(
        std::move(label_names), [bounds] { return std::make_unique<Histogram>(bounds); });
  }
  return *e.histogram;
}

void Registry::AddGaugeCallback(const std::string& name, const std::string& help,
                                std::vector<std::string> label_names,
                                std::function<std::vector<Sample>()> fn) {
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[name];
  e.help = help;
  e.type = "gauge";
  e.callback_labels = std::move(label_names);
  e.callback = std::move(fn);
}

void Registry::AddCounterCallback(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names,
                                  std::function<std::vector<Sample>()> fn) {
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[name];
  e.help = help;
  e.type = "counter";
  e.callback_labels = std::move(label_names);
  e.callback = std::move(fn);
}

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

namespace {

std::string EscapeHelp(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// {a="x",b="y"} plus an optional extra label (le for histogram buckets); "" when empty.
std::string Labels(const std::vector<std::string>& names, const LabelValues& values,
                   const std::string& extra_name = "", const std::string& extra_value = "") {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    out += out.empty() ? "{" : ",";
    out += names[i] + "=\"" + EscapeLabelValue(i < values.size() ? values[i] : "") + "\"";
  }
  if (!extra_name.empty()) {
    out += out.empty() ? "{" : ",";
    out += extra_name + "=\"" + extra_value + "\"";
  }
  if (!out.empty()) out += "}";
  return out;
}

}  // namespace

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
    return buf;
  }
  // The shortest decimal that reads back as the same double ("0.0025", not
  // "0.0025000000000000001").
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

std::string Registry::Render() const {
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& entry : entries_) {
    // Not a structured binding: the lambdas below capture these (clang before 16 refuses that).
    const auto& name = entry.first;
    const auto& e = entry.second;
    out += "# HELP " + name + " " + EscapeHelp(e.help) + "\n";
    out += "# TYPE " + name + " " + e.type + "\n";
    if (e.counter) {
      e.counter->ForEach([&](const LabelValues& values, const Counter& c) {
        out +=
            name + Labels(e.counter->label_names(), values) + " " + FormatValue(c.value()) + "\n";
      });
    } else if (e.gauge) {
      e.gauge->ForEach([&](const LabelValues& values, const Gauge& g) {
        out += name + Labels(e.gauge->label_names(), values) + " " + FormatValue(g.value()) + "\n";
      });
    } else if (e.histogram) {
      e.histogram->ForEach([&](const LabelValues& values, const Histogram& h) {
        const std::vector<uint64_t> counts = h.BucketCounts();
        const auto& names = e.histogram->label_names();
        uint64_t cumulative = 0;
        for (size_t i = 0; i < counts.size(); ++i) {
          cumulative += counts[i];
          const std::string le = i < h.bounds().size() ? FormatValue(h.bounds()[i]) : "+Inf";
          out += name + "_bucket" + Labels(names, values, "le", le) + " " +
                 FormatValue(static_cast<double>(cumulative)) + "\n";
        }
        out += name + "_sum" + Labels(names, values) + " " + FormatValue(h.sum()) + "\n";
        // The count is the +Inf bucket, so the two agree even while observations race.
        out += name + "_count" + Labels(names, values) + " " +
               FormatValue(static_cast<double>(cumulative)) + "\n";
      });
    } else if (e.callback) {
      for (const Sample& s : e.callback()) {
        out += name + Labels(e.callback_labels, s.labels) + " " + FormatValue(s.value) + "\n";
      }
    }
  }
  return out;
}

}  // namespace duet::metrics
