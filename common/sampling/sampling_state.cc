#include "common/sampling/sampling_state.h"

#include <algorithm>

namespace duet::model {

SamplingState::SamplingState(const SamplingParams& params, absl::Span<const int32_t> eos_ids,
                             absl::Span<const int32_t> prompt, absl::Span<const int32_t> generated)
    : track_prompt_(params.repetition_penalty != 1.f), track_output_(params.HasPenalties()) {
  if (track_prompt_) {
    for (int32_t t : prompt) Add(t, 0);
  }
  for (int32_t t : generated) AddGenerated(t);
  if (params.min_tokens > 0) {
    stop_ids_ = params.stop_token_ids;
    if (!params.ignore_eos) stop_ids_.insert(stop_ids_.end(), eos_ids.begin(), eos_ids.end());
    std::sort(stop_ids_.begin(), stop_ids_.end());
    stop_ids_.erase(std::unique(stop_ids_.begin(), stop_ids_.end()), stop_ids_.end());
  }
}

void SamplingState::AddGenerated(int32_t token) {
  ++generated_;
  if (track_output_) Add(token, 1);
}

void SamplingState::Add(int32_t token, int32_t output_count) {
  auto [it, inserted] = index_.try_emplace(token, penalty_tokens_.size());
  if (inserted) {
    penalty_tokens_.push_back({.id = token, .output_count = output_count});
  } else {
    penalty_tokens_[it->second].output_count += output_count;
  }
}

}  // namespace duet::model
