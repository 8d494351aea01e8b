// Sequence: one request's state in the engine core that every scheduler runs on
// (common/engine/step_runner.h): its tokens (the prompt, then each output token), sampling
// parameters and per-sequence sampling state, and its KV block table. Roles (the prefill node,
// the decode node, the colocated server, LocalEngine) keep their own request data beside it:
// streams, timings, transfer state.
//
// A sequence's K/V cover tokens[0, computed()); the rest, pending(), are computed by the next
// steps, and the step that computes the last of them samples the next token. A decode is a
// sequence whose one pending token is the last it appended (StepRunner::Append); a prompt (with
// any output tokens it was given, a resumed request's) is prefilled in chunks, its last chunk
// too when it is one token; a preempted sequence (its table gone) is resumed by computing every
// token again (the prefix cache may hold most of them), which samples exactly what it would
// have (invariant 1).
//
//   Sequence seq(/*id=*/1, prompt, /*generated_before=*/0, params, eos_ids);
//   seq.table = std::move(blocks).MakeTable(pool);   // KvCacheManager::AllocateSequence
//   // step_runner.Run({{&seq, seq.pending()}}): seq.tokens.back() is the first output token
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "common/kv/block_table.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_state.h"
#include "common/sampling/token_constraint.h"

namespace duet::engine {

struct Sequence {
  Sequence() = default;
  // `tokens`: the prompt, whose last `generated_before` tokens are output tokens produced
  // before (a resumed request's, already sent): they count against max_tokens and as output
  // for the penalties and min_tokens, and this sequence's tokens are numbered after them.
  Sequence(int64_t id, std::vector<int32_t> tokens, int generated_before,
           model::SamplingParams params, absl::Span<const int32_t> eos_ids);
  Sequence(Sequence&&) = default;
  Sequence& operator=(Sequence&&) = default;

  // Output tokens so far: the sample step of the next one.
  int generated() const { return static_cast<int>(tokens.size() - prompt_len); }
  // The output tokens it was given (a resumed request's), and later the ones it sampled.
  absl::Span<const int32_t> given_output() const {
    return absl::MakeConstSpan(tokens).subspan(prompt_len);
  }
  // Tokens whose K/V are in the table (0 without one).
  int64_t computed() const { return table != nullptr ? table->num_tokens() : 0; }
  // Tokens still to compute; the step that computes the last samples the next token.
  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - computed(); }
  // One token to compute, the last one appended (not one it was given): the sequence decodes.
  bool decoding() const { return generated() > generated_before && pending() == 1; }
  // Whether its prompt chunks are scored (params.prompt_logprobs): once, before the first
  // output token, so a prompt so scored takes nothing from the prefix cache.
  bool ScoresPrompt() const { return params.prompt_logprobs >= 0 && generated() == 0; }

  int64_t id = 0;               // unique among the sequences of one step (SequenceInput::seq_id)
  std::vector<int32_t> tokens;  // the prompt, then every output token
  int64_t prompt_len = 0;       // tokens[0, prompt_len) are the prompt
  int generated_before = 0;     // tokens[prompt_len, prompt_len + this): output given, not sampled
  model::SamplingParams params;
  model::SamplingState sampling_state;  // the prompt and every output token
  // Its KV; null while it holds none (waiting, preempted, done). KvCacheManager grows and ends it.
  std::unique_ptr<kv::BlockTable> table;
  int64_t cached_tokens = 0;  // of `table`, taken from the prefix cache when it was allocated
  std::vector<model::SampledToken> prompt_logprobs;  // ScoresPrompt: tokens 1..n-1, in order
  // Structured output (params.grammar): where its output stands in the grammar, having
  // accepted every output token so far (those given too), and the bitmask it fills before each
  // step that samples. Null without a grammar.
  std::unique_ptr<model::TokenConstraint> constraint;
  std::vector<int32_t> allowed_words;
};

}  // namespace duet::engine
