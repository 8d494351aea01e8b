// GrammarMatcher: one request's place in its compiled grammar. Each step it fills the mask of
// the tokens the grammar admits next, the sampler's logits row is masked with it, and the
// sampled token is accepted, moving the matcher on; the grammar ends when an EOS token is
// accepted where the output may end.
//
//   DUET_ASSIGN_OR_RETURN(GrammarMatcher matcher, GrammarMatcher::Create(grammar));
//   DUET_RETURN_IF_ERROR(matcher.Advance(generated_so_far));  // resume: replay, in order
//   TokenBitmask mask(matcher.vocab_size());
//   while (!matcher.IsTerminated()) {
//     DUET_RETURN_IF_ERROR(matcher.FillNextTokenBitmask(&mask).status());
//     DUET_RETURN_IF_ERROR(mask.Apply(logits));  // -inf where the grammar refuses the token
//     int32_t token = Sample(logits);
//     if (!matcher.AcceptToken(token)) { ... }   // only if the mask was not applied
//   }
//
// Not thread-safe: one matcher per request, used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/grammar/grammar_compiler.h"
#include "xgrammar/matcher.h"

namespace duet::grammar {

// One bit per token of a logits row: set when the token is allowed (xgrammar's layout: 32
// tokens per int32 word, token i at bit i % 32 of word i / 32).
class TokenBitmask {
 public:
  explicit TokenBitmask(int32_t vocab_size);

  int32_t vocab_size() const { return vocab_size_; }
  bool IsAllowed(int32_t token) const {
    return token >= 0 && token < vocab_size_ &&
           ((static_cast<uint32_t>(words_[token >> 5]) >> (token & 31)) & 1u) != 0;
  }
  int32_t CountAllowed() const;
  // Sets every logit whose token is not allowed to -inf and leaves the others as they are (the
  // same result whatever the row holds); InvalidArgument when logits is not vocab_size wide.
  absl::Status Apply(absl::Span<float> logits) const;

  std::vector<int32_t>& words() { return words_; }
  const std::vector<int32_t>& words() const { return words_; }

 private:
  int32_t vocab_size_;
  std::vector<int32_t> words_;
};

class GrammarMatcher {
 public:
  static absl::StatusOr<GrammarMatcher> Create(std::shared_ptr<const CompiledGrammar> grammar);
  GrammarMatcher(GrammarMatcher&&) = default;
  GrammarMatcher& operator=(GrammarMatcher&&) = default;

  // Moves on over token when the grammar admits it next; false (the matcher unchanged) when it
  // does not, when the token is outside the vocabulary, or after the grammar has terminated.
  bool AcceptToken(int32_t token);
  // Accepts tokens in order (a request's tokens generated before a resume or re-route);
  // InvalidArgument naming the first refused one and its position, the tokens before it
  // accepted.
  absl::Status Advance(absl::Span<const int32_t> tokens);
  // Fills mask with the tokens allowed next (none once terminated); false when every token is
  // allowed (applying the mask would change nothing). InvalidArgument when the mask is not
  // vocab_size() wide.
  absl::StatusOr<bool> FillNextTokenBitmask(TokenBitmask* mask);
  // An EOS token was accepted where the grammar may end.
  bool IsTerminated() const;
  // The accepted tokens form a complete output (an EOS token would be admitted now).
  bool IsCompleted() const;
  // Undoes the last n accepted tokens (speculative decoding's rejected drafts, a stop string's
  // tokens); OutOfRange when fewer than n were accepted.
  absl::Status Rollback(int n);
  int64_t accepted() const { return accepted_; }
  int32_t vocab_size() const { return grammar_->vocab_size(); }
  const GrammarSpec& spec() const { return grammar_->spec(); }

 private:
  GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar, xgrammar::GrammarMatcher matcher)
      : grammar_(std::move(grammar)), matcher_(std::move(matcher)) {}

  std::shared_ptr<const CompiledGrammar> grammar_;
  xgrammar::GrammarMatcher matcher_;
  int64_t accepted_ = 0;  // tokens accepted and not rolled back
};

}  // namespace duet::grammar
