#include "bench/serve_bench/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace duet::bench {

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  q = std::clamp(q, 0.0, 100.0);
  const double rank = q / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Summary Summarize(std::vector<double> values) {
  Summary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.count = static_cast<int64_t>(values.size());
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(s.count);
  s.min = values.front();
  s.max = values.back();
  s.p50 = Percentile(values, 50);
  s.p90 = Percentile(values, 90);
  s.p99 = Percentile(values, 99);
  return s;
}

bool MeetsSlo(const Slo& slo, double ttft_ms, double tpot_ms, bool has_tpot, double e2e_ms) {
  if (slo.ttft_ms > 0 && ttft_ms > slo.ttft_ms) return false;
  if (slo.tpot_ms > 0 && has_tpot && tpot_ms > slo.tpot_ms) return false;
  if (slo.e2e_ms > 0 && e2e_ms > slo.e2e_ms) return false;
  return true;
}

}  // namespace duet::bench
