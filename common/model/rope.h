// Rotary position embedding frequencies for a ModelConfig, including rope_scaling (llama3,
// linear) and the separate base of Gemma 3's sliding layers.
//
//   std::vector<float> inv_freq = RopeInvFreq(config);  // head_dim / 2 entries
//   // angle of pair i at position p: p * inv_freq[i]  (HF rotate_half convention: pair i is
//   // (x[i], x[i + head_dim/2]))
#pragma once

#include <vector>

#include "common/config/model_config.h"

namespace duet::model {

// inv_freq[i] = 1 / base^(2i / head_dim), i in [0, head_dim/2), then rescaled per HF's
// _compute_llama3_parameters (llama3) or divided by the factor (linear). The base is rope_theta,
// or, for a sliding layer of a config that has one, rope_local_theta (unscaled). Computed in
// double, cast to float.
std::vector<float> RopeInvFreq(const ModelConfig& c, bool sliding_layer = false);

// Same in double precision (for references and tests).
std::vector<double> RopeInvFreqF64(const ModelConfig& c, bool sliding_layer = false);

}  // namespace duet::model
