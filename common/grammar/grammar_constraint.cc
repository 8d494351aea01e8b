#include "common/grammar/grammar_constraint.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace duet::grammar {

absl::StatusOr<bool> GrammarConstraint::FillAllowed(absl::Span<int32_t> words) {
  if (words.size() != mask_.words().size()) {
    return absl::InvalidArgumentError(absl::StrCat("grammar constraint: a mask of ", words.size(),
                                                   " words for a vocabulary of ",
                                                   matcher_.vocab_size(), " tokens"));
  }
  DUET_ASSIGN_OR_RETURN(const bool masked, matcher_.FillNextTokenBitmask(&mask_));
  if (masked) std::copy(mask_.words().begin(), mask_.words().end(), words.begin());
  return masked;
}

absl::Status GrammarConstraint::Accept(int32_t token) {
  if (matcher_.AcceptToken(token)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      GrammarKindName(matcher_.spec().kind), " grammar: token ", token, " after ",
      matcher_.accepted(), " accepted ",
      matcher_.IsTerminated() ? "comes after the grammar ended" : "is not allowed there"));
}

absl::StatusOr<std::unique_ptr<model::TokenConstraint>> MakeGrammarConstraint(
    GrammarCompiler* compiler, const GrammarSpec& spec, absl::Span<const int32_t> generated) {
  if (compiler == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "structured output (a ", GrammarKindName(spec.kind),
        " grammar) is not available here: no grammar compiler for the model's tokenizer (none, "
        "or one the grammar engine refused; the server's log says why)"));
  }
  DUET_ASSIGN_OR_RETURN(std::shared_ptr<const CompiledGrammar> compiled, compiler->Compile(spec));
  DUET_ASSIGN_OR_RETURN(GrammarMatcher matcher, GrammarMatcher::Create(std::move(compiled)));
  DUET_RETURN_IF_ERROR(Annotate(matcher.Advance(generated), "the output tokens already generated"));
  return std::make_unique<GrammarConstraint>(std::move(matcher));
}

absl::StatusOr<std::unique_ptr<model::TokenConstraint>> ConstraintFor(
    GrammarCompiler* compiler, const model::SamplingParams& params,
    absl::Span<const int32_t> generated) {
  if (!params.grammar.has_value()) return nullptr;
  return MakeGrammarConstraint(compiler, *params.grammar, generated);
}

}  // namespace duet::grammar
