#include "common/grammar/grammar_matcher.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace duet::grammar {

TokenBitmask::TokenBitmask(int32_t vocab_size)
    : vocab_size_(vocab_size), words_(xgrammar::GetBitmaskSize(vocab_size), 0) {}

int32_t TokenBitmask::CountAllowed() const {
  int32_t count = 0;
  for (int32_t id = 0; id < vocab_size_; ++id) count += IsAllowed(id) ? 1 : 0;
  return count;
}

absl::Status TokenBitmask::Apply(absl::Span<float> logits) const {
  if (logits.size() != static_cast<size_t>(vocab_size_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token bitmask: the logits row has ", logits.size(), " entries, the mask ", vocab_size_));
  }
  constexpr float kRefused = -std::numeric_limits<float>::infinity();
  for (int32_t id = 0; id < vocab_size_; ++id) {
    if (!IsAllowed(id)) logits[id] = kRefused;
  }
  return absl::OkStatus();
}

absl::StatusOr<GrammarMatcher> GrammarMatcher::Create(
    std::shared_ptr<const CompiledGrammar> grammar) {
  if (grammar == nullptr) return absl::InvalidArgumentError("grammar matcher: no grammar");
  try {
    xgrammar::GrammarMatcher matcher(grammar->xgrammar());
    return GrammarMatcher(std::move(grammar), std::move(matcher));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("grammar matcher: ", e.what()));
  }
}

bool GrammarMatcher::AcceptToken(int32_t token) {
  if (token < 0 || token >= vocab_size() || matcher_.IsTerminated()) return false;
  if (!matcher_.AcceptToken(token)) return false;
  ++accepted_;
  return true;
}

absl::Status GrammarMatcher::Advance(absl::Span<const int32_t> tokens) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!AcceptToken(tokens[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          GrammarKindName(spec().kind), " grammar: token ", tokens[i], " at position ", i, " of ",
          tokens.size(), IsTerminated() ? " comes after the grammar ended" : " is refused"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> GrammarMatcher::FillNextTokenBitmask(TokenBitmask* mask) {
  if (mask->vocab_size() != vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat("grammar matcher: a mask of ",
                                                   mask->vocab_size(), " tokens for a grammar of ",
                                                   vocab_size()));
  }
  std::vector<int32_t>& words = mask->words();
  if (matcher_.IsTerminated()) {
    std::fill(words.begin(), words.end(), 0);
    return true;
  }
  int64_t shape[1] = {static_cast<int64_t>(words.size())};
  DLTensor tensor{};
  tensor.data = words.data();
  tensor.device = DLDevice{kDLCPU, 0};
  tensor.ndim = 1;
  tensor.dtype = xgrammar::GetBitmaskDLType();
  tensor.shape = shape;
  try {
    return matcher_.FillNextTokenBitmask(&tensor);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("grammar matcher: filling the mask: ", e.what()));
  }
}

bool GrammarMatcher::IsTerminated() const { return matcher_.IsTerminated(); }

bool GrammarMatcher::IsCompleted() const { return matcher_.IsCompleted(); }

absl::Status GrammarMatcher::Rollback(int n) {
  if (n < 0 || n > accepted_) {
    return absl::OutOfRangeError(
        absl::StrCat("grammar matcher: cannot roll back ", n, " tokens: ", accepted_, " accepted"));
  }
  if (n == 0) return absl::OkStatus();
  matcher_.Rollback(n);
  accepted_ -= n;
  return absl::OkStatus();
}

}  // namespace duet::grammar
