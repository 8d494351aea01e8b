#include "common/engine/sequence.h"

#include <utility>

#include "common/base/logging.h"

namespace duet::engine {

Sequence::Sequence(int64_t id, std::vector<int32_t> tokens, int generated_before,
                   model::SamplingParams params, absl::Span<const int32_t> eos_ids)
    : id(id),
      tokens(std::move(tokens)),
      prompt_len(static_cast<int64_t>(this->tokens.size()) - generated_before),
      generated_before(generated_before),
      params(std::move(params)) {
  DUET_CHECK(generated_before >= 0 && prompt_len >= 0)
      << "Sequence: " << generated_before << " generated tokens of " << this->tokens.size();
  const absl::Span<const int32_t> all = this->tokens;
  sampling_state =
      model::SamplingState(this->params, eos_ids, all.first(prompt_len), all.subspan(prompt_len));
}

}  // namespace duet::engine
