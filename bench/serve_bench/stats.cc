#include "bench/serve_bench/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

#include "absl/strings/str_cat.h"

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

absl::Status CheckSloFlags(const Slo& slo, const std::vector<std::string>& given) {
  for (const auto& [name, dashed, value] : {std::tuple{"slo_ttft_ms", "slo-ttft-ms", slo.ttft_ms},
                                            std::tuple{"slo_tpot_ms", "slo-tpot-ms", slo.tpot_ms},
                                            std::tuple{"slo_e2e_ms", "slo-e2e-ms", slo.e2e_ms}}) {
    const bool was_given = std::find(given.begin(), given.end(), name) != given.end();
    if (value < 0 || (was_given && !(value > 0))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", dashed, " must be > 0 (got ", value, ")"));
    }
  }
  if (!(slo.attainment > 0 && slo.attainment <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slo-attainment must be in (0, 1] (got ", slo.attainment, ")"));
  }
  return absl::OkStatus();
}

}  // namespace duet::bench
