// GrammarConstraint: structured output as the engine core sees it, a model::TokenConstraint
// (common/sampling/token_constraint.h) over one request's GrammarMatcher. Every node that samples
// for a request (the prefill node's first token, the decode node's later ones, the colocated
// server's all) builds one from the request's spec with its own GrammarCompiler and the output
// tokens the request already has (a resumed or re-routed request's, replayed in order), so each
// stands where one process would: the cluster samples the same tokens.
//
//   DUET_ASSIGN_OR_RETURN(seq.constraint,   // null when params.grammar is not set
//                         ConstraintFor(compiler, seq.params, seq.given_output()));
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/grammar/grammar_compiler.h"
#include "common/grammar/grammar_matcher.h"
#include "common/grammar/grammar_spec.h"
#include "common/sampling/sampler.h"
#include "common/sampling/token_constraint.h"

namespace duet::grammar {

class GrammarConstraint : public model::TokenConstraint {
 public:
  explicit GrammarConstraint(GrammarMatcher matcher)
      : matcher_(std::move(matcher)), mask_(matcher_.vocab_size()) {}

  absl::StatusOr<bool> FillAllowed(absl::Span<int32_t> words) override;
  absl::Status Accept(int32_t token) override;
  bool Terminated() const override { return matcher_.IsTerminated(); }

  const GrammarMatcher& matcher() const { return matcher_; }

 private:
  GrammarMatcher matcher_;
  TokenBitmask mask_;
};

// The spec compiled (once per distinct spec: the compiler's cache) and a matcher moved over
// `generated`, the request's output tokens so far. Unimplemented without a compiler (a node
// without the model's tokenizer, or one the grammar engine refused); the compiler's errors
// (InvalidArgument for a spec it cannot compile, DeadlineExceeded, ResourceExhausted);
// InvalidArgument naming the first of `generated` the grammar refuses.
absl::StatusOr<std::unique_ptr<model::TokenConstraint>> MakeGrammarConstraint(
    GrammarCompiler* compiler, const GrammarSpec& spec, absl::Span<const int32_t> generated);

// What a scheduler calls at admission: MakeGrammarConstraint for params.grammar, or null (no
// constraint) when it is not set.
absl::StatusOr<std::unique_ptr<model::TokenConstraint>> ConstraintFor(
    GrammarCompiler* compiler, const model::SamplingParams& params,
    absl::Span<const int32_t> generated);

}  // namespace duet::grammar
