#include "bench/goodput_sim/cost_model.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace duet::goodput_sim {

double PrefillMs(const UnitCosts& c, int64_t tokens) { return StepMs(c, tokens, 0, 0); }

double DecodeMs(const UnitCosts& c, int batch, int64_t context_tokens) {
  return StepMs(c, 0, batch, context_tokens);
}

double StepMs(const UnitCosts& c, int64_t prefill_tokens, int decodes, int64_t context_tokens) {
  if (prefill_tokens <= 0 && decodes <= 0) return 0;
  double fixed = prefill_tokens > 0 ? c.prefill.fixed_ms : 0;
  if (decodes > 0) fixed = std::max(fixed, c.decode.fixed_ms);
  const int batch = std::max(decodes, 0);
  return fixed +
         c.prefill.per_token_ms * static_cast<double>(std::max<int64_t>(prefill_tokens, 0)) +
         (c.decode.per_seq_ms + c.seq_overhead_ms) * batch +
         c.decode.per_context_token_ms * static_cast<double>(std::max<int64_t>(context_tokens, 0)) +
         c.step_overhead_ms;
}

double TransferMs(const TransferCost& t, int64_t prompt_tokens) {
  const int64_t block = std::max(t.block_tokens, 1);
  const int64_t tokens = (prompt_tokens + block - 1) / block * block;
  return t.fixed_ms + 1e3 * t.kv_bytes_per_token * static_cast<double>(tokens) / t.bytes_per_s;
}

absl::StatusOr<UnitCosts> ScaleTo(const UnitCosts& c, const MachineScale& scale) {
  if (!(scale.compute > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("compute scale must be > 0, got ", scale.compute));
  }
  if (!(scale.bandwidth > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bandwidth scale must be > 0, got ", scale.bandwidth));
  }
  UnitCosts s = c;
  s.prefill.fixed_ms /= scale.bandwidth;
  s.prefill.per_token_ms /= scale.compute;
  s.decode.fixed_ms /= scale.bandwidth;
  s.decode.per_seq_ms /= scale.compute;
  s.decode.per_context_token_ms /= scale.bandwidth;
  return s;
}

absl::StatusOr<Line> FitLine(const std::vector<double>& xs, const std::vector<double>& ys) {
  if (xs.size() != ys.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FitLine: ", xs.size(), " x values but ", ys.size(), " y values"));
  }
  const double n = static_cast<double>(xs.size());
  double sx = 0, sy = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    sx += xs[i];
    sy += ys[i];
  }
  const double mx = sx / std::max(n, 1.0), my = sy / std::max(n, 1.0);
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    sxx += (xs[i] - mx) * (xs[i] - mx);
    sxy += (xs[i] - mx) * (ys[i] - my);
  }
  if (xs.size() < 2 || sxx <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FitLine: needs two or more points with distinct x, got ", xs.size()));
  }
  Line line;
  line.slope = sxy / sxx;
  line.intercept = my - line.slope * mx;
  for (size_t i = 0; i < xs.size(); ++i) {
    line.max_abs_residual =
        std::max(line.max_abs_residual, std::fabs(ys[i] - (line.intercept + line.slope * xs[i])));
  }
  return line;
}

}  // namespace duet::goodput_sim
