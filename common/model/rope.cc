#include "common/model/rope.h"

#include <cmath>
#include <numbers>

namespace duet::model {

std::vector<double> RopeInvFreqF64(const ModelConfig& c, bool sliding_layer) {
  const int half = c.head_dim / 2;
  std::vector<double> inv(half);
  // Gemma 3's sliding layers have a base of their own and no scaling.
  const bool local = sliding_layer && c.rope_local_theta > 0;
  const double theta = static_cast<double>(local ? c.rope_local_theta : c.rope_theta);
  for (int i = 0; i < half; ++i) {
    inv[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / c.head_dim);
  }
  if (local || !c.rope_scaling) return inv;
  if (c.rope_scaling->rope_type == "linear") {
    for (double& f : inv) f /= c.rope_scaling->factor;
    return inv;
  }
  if (c.rope_scaling->rope_type != "llama3") return inv;  // Validate() admits no other

  const RopeScaling& rs = *c.rope_scaling;
  const double factor = rs.factor;
  const double low = rs.low_freq_factor;
  const double high = rs.high_freq_factor;
  const double old_ctx = rs.original_max_position_embeddings;
  const double low_freq_wavelen = old_ctx / low;
  const double high_freq_wavelen = old_ctx / high;
  for (int i = 0; i < half; ++i) {
    const double wavelen = 2.0 * std::numbers::pi / inv[i];
    if (wavelen < high_freq_wavelen) continue;  // high frequency: unchanged
    if (wavelen > low_freq_wavelen) {           // low frequency: scaled down
      inv[i] = inv[i] / factor;
      continue;
    }
    // Medium: interpolate between scaled and unscaled.
    const double smooth = (old_ctx / wavelen - low) / (high - low);
    inv[i] = (1.0 - smooth) * inv[i] / factor + smooth * inv[i];
  }
  return inv;
}

std::vector<float> RopeInvFreq(const ModelConfig& c, bool sliding_layer) {
  std::vector<double> d = RopeInvFreqF64(c, sliding_layer);
  return std::vector<float>(d.begin(), d.end());
}

}  // namespace duet::model
