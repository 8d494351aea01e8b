// TokenConstraint: which tokens a sequence may sample next beyond what its sampling parameters
// say: structured output's grammar (common/grammar/grammar_constraint.h) is one. The engine core
// (common/engine/step_runner.h) asks it for a bitmask of the allowed tokens before each step that
// samples the sequence, the backend sets every other logit to -inf before it processes and
// samples the row (ComputeBackend::MaskLogits), and every token the sequence takes, sampled here
// or given (a prefill node's first token on the decode node), is accepted in order.
//
//   std::vector<int32_t> words(TokenMaskWords(vocab));
//   DUET_ASSIGN_OR_RETURN(bool masked, constraint->FillAllowed(absl::MakeSpan(words)));
//   ... sample with the mask when `masked` ...
//   DUET_RETURN_IF_ERROR(constraint->Accept(token));
//   if (constraint->Terminated()) ...  // it took the token that ends the output
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace duet::model {

// Words of a token bitmask over `vocab` tokens: bit t % 32 of word t / 32 is token t.
inline int64_t TokenMaskWords(int64_t vocab) { return (vocab + 31) / 32; }

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets the bit of each token allowed next and clears the others; false when every token is
  // allowed (the mask would change nothing and need not be applied). InvalidArgument when
  // `words` is not TokenMaskWords(vocab) long.
  virtual absl::StatusOr<bool> FillAllowed(absl::Span<int32_t> words) = 0;
  // Moves on over `token`, the sequence's next output token; InvalidArgument naming it when it
  // is not allowed there (nothing changed).
  virtual absl::Status Accept(int32_t token) = 0;
  // Whether the last token accepted ended the output (nothing more is allowed).
  virtual bool Terminated() const = 0;
};

}  // namespace duet::model
