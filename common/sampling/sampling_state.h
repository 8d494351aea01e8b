// SamplingState: what sampling needs to know about one sequence's tokens so far, for the
// parameters that depend on them (common/sampling/sampler.h): the penalty tokens (the prompt's for
// repetition_penalty, the output's with their counts for all three penalties) and the ids that
// min_tokens bans (stop_token_ids, and EOS unless ignore_eos). Every node that samples for a
// request builds one from the same prompt and output tokens, so the disaggregated cluster
// samples what one process would; a resumed request passes the tokens already sent as output.
// Adding a token is O(1) (a hash map from id to its entry); nothing is kept for parameters that
// do not need it.
//
//   SamplingState state(params, tokenizer.eos_ids(), prompt, /*generated=*/{});
//   batch[0].sample = &params;  batch[0].sample_state = &state;  batch[0].sample_step = 0;
//   ... Forward ...;  state.AddGenerated(out.tokens[0].id);
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling.h"

namespace duet::model {

class SamplingState {
 public:
  SamplingState() = default;
  SamplingState(const SamplingParams& params, absl::Span<const int32_t> eos_ids,
                absl::Span<const int32_t> prompt, absl::Span<const int32_t> generated);

  // Counts `token` as the next output token.
  void AddGenerated(int32_t token);

  // Output tokens so far (the sample_step of the next one).
  int64_t generated() const { return generated_; }
  // Distinct ids, for RowSampling::penalty_tokens (empty without penalties).
  absl::Span<const compute::PenaltyToken> penalty_tokens() const { return penalty_tokens_; }
  // Strictly increasing: banned while generated() < min_tokens (empty when min_tokens is 0).
  absl::Span<const int32_t> stop_ids() const { return stop_ids_; }

 private:
  void Add(int32_t token, int32_t output_count);

  bool track_prompt_ = false;
  bool track_output_ = false;
  int64_t generated_ = 0;
  std::vector<compute::PenaltyToken> penalty_tokens_;
  absl::flat_hash_map<int32_t, size_t> index_;  // id -> its entry in penalty_tokens_
  std::vector<int32_t> stop_ids_;
};

}  // namespace duet::model
