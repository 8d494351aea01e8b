#include "common/model/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace duet::model {

absl::Status SamplingParams::Validate(int vocab_size) const {
  if (!(temperature >= 0.f) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be >= 0, got ", temperature));
  }
  if (!(top_p > 0.f && top_p <= 1.f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", top_k));
  if (max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", max_tokens));
  }
  if (logprobs < 0 || logprobs > compute::kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs must be in [0, ", compute::kMaxTopLogprobs, "], got ", logprobs));
  }
  for (int32_t id : stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop token id ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

const char* StopReasonName(StopReason r) {
  switch (r) {
    case StopReason::kNone: return "none";
    case StopReason::kEos: return "eos";
    case StopReason::kStopToken: return "stop";
    case StopReason::kMaxTokens: return "length";
  }
  return "unknown";
}

compute::RowSampling ToRowSampling(const SamplingParams& params, int64_t step) {
  return compute::RowSampling{.temperature = params.temperature,
                              .top_p = params.top_p,
                              .top_k = params.top_k,
                              .seed = params.seed,
                              .step = step,
                              .num_logprobs = params.logprobs};
}

SampledToken Sample(const float* logits, int vocab, const SamplingParams& params, int64_t step) {
  return compute::SampleRowOnHost(logits, vocab, ToRowSampling(params, step));
}

StopReason CheckStop(const SamplingParams& params, const std::vector<int32_t>& eos_ids,
                     int32_t token, int generated) {
  if (!params.ignore_eos &&
      std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end()) {
    return StopReason::kEos;
  }
  if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) !=
      params.stop_token_ids.end()) {
    return StopReason::kStopToken;
  }
  if (generated >= params.max_tokens) return StopReason::kMaxTokens;
  return StopReason::kNone;
}

}  // namespace duet::model
