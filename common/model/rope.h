// Rotary position embedding frequencies for a ModelConfig, including Llama 3's rope_scaling.
//
//   std::vector<float> inv_freq = RopeInvFreq(config);  // head_dim / 2 entries
//   // angle of pair i at position p: p * inv_freq[i]  (HF rotate_half convention: pair i is
//   // (x[i], x[i + head_dim/2]))
#pragma once

#include <vector>

#include "common/model/model_config.h"

namespace duet::model {

// inv_freq[i] = 1 / rope_theta^(2i / head_dim), i in [0, head_dim/2), then rescaled per HF's
// _compute_llama3_parameters when rope_scaling is llama3. Computed in double, cast to float.
std::vector<float> RopeInvFreq(const ModelConfig& c);

// Same in double precision (for references and tests).
std::vector<double> RopeInvFreqF64(const ModelConfig& c);

}  // namespace duet::model
