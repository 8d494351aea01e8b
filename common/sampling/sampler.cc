#include "common/sampling/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/base/vocabulary.h"
#include "common/sampling/sampling_state.h"

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
  if (prompt_logprobs < -1 || prompt_logprobs > compute::kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_logprobs must be in [0, ",
                                                   compute::kMaxTopLogprobs, "] (or off), got ",
                                                   prompt_logprobs));
  }
  if (!(min_p >= 0.f && min_p <= 1.f)) {
    return absl::InvalidArgumentError(absl::StrCat("min_p must be in [0, 1], got ", min_p));
  }
  if (!(repetition_penalty > 0.f) || !std::isfinite(repetition_penalty)) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be > 0, got ", repetition_penalty));
  }
  if (!(presence_penalty >= -2.f && presence_penalty <= 2.f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("presence_penalty must be in [-2, 2], got ", presence_penalty));
  }
  if (!(frequency_penalty >= -2.f && frequency_penalty <= 2.f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("frequency_penalty must be in [-2, 2], got ", frequency_penalty));
  }
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_tokens must be in [0, max_tokens = ", max_tokens, "], got ", min_tokens));
  }
  if (grammar.has_value()) {
    DUET_RETURN_IF_ERROR(grammar::ValidateGrammarSpec(*grammar));
    // The grammar alone says where the output may end: a stop token it admits ends it.
    if (ignore_eos) {
      return absl::InvalidArgumentError(
          "ignore_eos cannot be combined with structured output (the grammar ends the output)");
    }
    if (min_tokens > 0) {
      return absl::InvalidArgumentError(
          "min_tokens cannot be combined with structured output (the grammar ends the output)");
    }
  }
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const compute::LogitBias& b = logit_bias[i];
    if (absl::Status s = CheckVocabularyId(b.id, vocab_size, "logit_bias token id"); !s.ok()) {
      return s;
    }
    if (!(b.bias >= -100.f && b.bias <= 100.f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias of token ", b.id, " must be in [-100, 100], got ", b.bias));
    }
    if (i > 0 && logit_bias[i - 1].id >= b.id) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias token ids must be distinct and increasing (", b.id, ")"));
    }
  }
  for (int32_t id : stop_token_ids) {
    if (absl::Status s = CheckVocabularyId(id, vocab_size, "stop token id"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

bool SamplingParams::NeedsState() const { return HasPenalties() || min_tokens > 0; }

const char* StopReasonName(StopReason r) {
  switch (r) {
    case StopReason::kNone: return "none";
    case StopReason::kEos: return "eos";
    case StopReason::kStopToken: return "stop";
    case StopReason::kMaxTokens: return "length";
  }
  return "unknown";
}

compute::RowSampling ToRowSampling(const SamplingParams& params, int64_t step,
                                   const SamplingState* state) {
  compute::RowSampling row{.temperature = params.temperature,
                           .top_p = params.top_p,
                           .top_k = params.top_k,
                           .seed = params.seed,
                           .step = step,
                           .num_logprobs = params.logprobs,
                           .min_p = params.min_p,
                           .repetition_penalty = params.repetition_penalty,
                           .presence_penalty = params.presence_penalty,
                           .frequency_penalty = params.frequency_penalty,
                           .logit_bias = params.logit_bias};
  if (state != nullptr) {
    row.penalty_tokens = state->penalty_tokens();
    if (step < params.min_tokens) row.banned_ids = state->stop_ids();
  }
  return row;
}

SampledToken Sample(const float* logits, int vocab, const SamplingParams& params, int64_t step,
                    const SamplingState* state) {
  DUET_CHECK(state != nullptr || !params.NeedsState())
      << "Sample: penalties and min_tokens need the sequence's SamplingState";
  return compute::SampleRowOnHost(logits, vocab, ToRowSampling(params, step, state));
}

StopReason CheckStop(const SamplingParams& params, const std::vector<int32_t>& eos_ids,
                     int32_t token, int generated) {
  if (generated < params.min_tokens) {
    return generated >= params.max_tokens ? StopReason::kMaxTokens : StopReason::kNone;
  }
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

StopReason StopAfterToken(const SamplingParams& params, const std::vector<int32_t>& eos_ids,
                          int32_t token, int generated, int64_t held, int64_t max_positions) {
  const StopReason stop = CheckStop(params, eos_ids, token, generated);
  if (stop == StopReason::kNone && held + 1 > max_positions) return StopReason::kMaxTokens;
  return stop;
}

void ScorePromptChunk(const float* rows, int vocab, int64_t num_rows, int64_t start,
                      absl::Span<const int32_t> prompt, int num_logprobs,
                      std::vector<SampledToken>* out) {
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t next = start + r + 1;
    if (next >= static_cast<int64_t>(prompt.size())) break;
    out->push_back(compute::ScoreRowOnHost(rows + r * vocab, vocab, prompt[next], num_logprobs));
  }
}

}  // namespace duet::model
