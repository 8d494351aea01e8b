// Sampler: a request's sampling parameters (greedy, temperature, top-k, top-p, min-p, logprobs,
// penalties, logit bias, min tokens) and stop rules (EOS, stop tokens, max tokens). The sampling
// itself is the compute backend's (common/sampling/sampling.h): ModelRunner::Forward samples on
// the backend when a sequence carries its parameters, and Sample() here runs the same algorithm
// on one row of host logits. The random draw for output token i depends only on (seed, i); the
// penalties and min_tokens depend on the tokens so far, which a SamplingState
// (common/sampling/sampling_state.h) holds per sequence. A request whose first token is sampled on
// a prefill node and the rest on a decode node, each with a state built from the same prompt and
// output tokens, draws exactly what a single process would.
//
//   SamplingParams p{.temperature = 0.7f, .top_p = 0.9f, .seed = 1, .logprobs = 5};
//   SampledToken t = Sample(logits, vocab, p, /*step=*/0);
//   StopReason r = CheckStop(p, eos_ids, t.id, /*generated=*/1);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/grammar/grammar_spec.h"
#include "common/sampling/sampling.h"

namespace duet::model {

struct SamplingParams {
  float temperature = 0.f;  // <= 0: greedy
  float top_p = 1.f;        // (0, 1]
  int top_k = 0;            // 0: off
  uint64_t seed = 0;
  int max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int logprobs = 0;         // top-N log-probabilities to report per token (0: none)
  float min_p = 0.f;        // [0, 1]; 0: off
  float repetition_penalty = 1.f;  // (0, inf) over prompt and output tokens; 1: off
  float presence_penalty = 0.f;    // [-2, 2] over output tokens
  float frequency_penalty = 0.f;   // [-2, 2] over output tokens
  // Added to the logits before sampling: ids strictly increasing, biases in [-100, 100].
  std::vector<compute::LogitBias> logit_bias;
  // EOS (unless ignore_eos) and stop_token_ids cannot be sampled before this many output tokens
  // ([0, max_tokens]).
  int min_tokens = 0;
  // >= 0: score every prompt token after the first (its logprob given the tokens before it)
  // with this many alternatives ([0, kMaxTopLogprobs]); the prefill then computes the whole
  // prompt (a cached prefix has no logits). -1: off.
  int prompt_logprobs = -1;
  // Structured output: every sampled token is one the grammar admits next (the sequence's
  // TokenConstraint, token_constraint.h, built from it by the node that samples). Not with
  // ignore_eos or min_tokens (the grammar decides where the output may end).
  std::optional<grammar::GrammarSpec> grammar;

  absl::Status Validate(int vocab_size) const;
  // Whether sampling needs the sequence's SamplingState (penalties or min_tokens).
  bool NeedsState() const;
  bool HasPenalties() const {
    return repetition_penalty != 1.f || presence_penalty != 0.f || frequency_penalty != 0.f;
  }
};

class SamplingState;

// {id, logprob, top_logprobs}: see sampling/sampling.h.
using SampledToken = compute::SampledToken;

enum class StopReason { kNone, kEos, kStopToken, kMaxTokens };
const char* StopReasonName(StopReason r);

// The backend's per-row parameters for generating output token `step` (0 for the first).
// `state` (required when params.NeedsState(), else may be null) gives the penalty tokens and the
// min_tokens ban; the result points into params and state.
compute::RowSampling ToRowSampling(const SamplingParams& params, int64_t step,
                                   const SamplingState* state = nullptr);

// Prompt logprobs of one chunk: `rows` (consecutive rows of all_logits output, vocab wide) hold
// the logits after prompt positions start, start + 1, ...; each scores the prompt token after
// its position (none after the last), with `num_logprobs` alternatives, appended to `out`.
void ScorePromptChunk(const float* rows, int vocab, int64_t num_rows, int64_t start,
                      absl::Span<const int32_t> prompt, int num_logprobs,
                      std::vector<SampledToken>* out);

// `step` is the index of the token being generated (0 for the first output token).
// compute::SampleRowOnHost(logits, vocab, ToRowSampling(params, step, state)).
SampledToken Sample(const float* logits, int vocab, const SamplingParams& params, int64_t step,
                    const SamplingState* state = nullptr);

// Whether generation ends after emitting `token` as the `generated`-th output token. Before
// min_tokens output tokens only max_tokens ends it (as vLLM).
StopReason CheckStop(const SamplingParams& params, const std::vector<int32_t>& eos_ids,
                     int32_t token, int generated);
// The stop rule of every generator (LocalEngine, the decode node, the colocated server):
// CheckStop, else kMaxTokens once the context is full (the cache holds `held` tokens and the
// token just emitted would be past `max_positions`).
StopReason StopAfterToken(const SamplingParams& params, const std::vector<int32_t>& eos_ids,
                          int32_t token, int generated, int64_t held, int64_t max_positions);

}  // namespace duet::model
