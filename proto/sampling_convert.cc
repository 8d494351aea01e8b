#include "proto/sampling_convert.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace duet::rpc {
namespace {

// The wire's kind; KIND_UNSPECIFIED (or a kind this build does not know) stays unset on purpose:
// GrammarFromProto refuses it by name rather than guessing.
constexpr std::pair<v1::GrammarSpec::Kind, grammar::GrammarKind> kGrammarKinds[] = {
    {v1::GrammarSpec::KIND_JSON_OBJECT, grammar::GrammarKind::kJsonObject},
    {v1::GrammarSpec::KIND_JSON_SCHEMA, grammar::GrammarKind::kJsonSchema},
    {v1::GrammarSpec::KIND_REGEX, grammar::GrammarKind::kRegex},
    {v1::GrammarSpec::KIND_CHOICE, grammar::GrammarKind::kChoice},
    {v1::GrammarSpec::KIND_EBNF, grammar::GrammarKind::kEbnf},
};

}  // namespace

absl::StatusOr<grammar::GrammarSpec> GrammarFromProto(const v1::GrammarSpec& proto) {
  grammar::GrammarSpec spec;
  bool known = false;
  for (const auto& [wire, kind] : kGrammarKinds) {
    if (wire == proto.kind()) {
      spec.kind = kind;
      known = true;
    }
  }
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.grammar.kind ", static_cast<int>(proto.kind()),
                     " is not a grammar kind (json_object, json_schema, regex, choice, ebnf)"));
  }
  spec.text = proto.text();
  spec.choices.assign(proto.choices().begin(), proto.choices().end());
  spec.strict = proto.strict();
  return spec;
}

v1::GrammarSpec GrammarToProto(const grammar::GrammarSpec& spec) {
  v1::GrammarSpec p;
  for (const auto& [wire, kind] : kGrammarKinds) {
    if (kind == spec.kind) p.set_kind(wire);
  }
  p.set_text(spec.text);
  for (const std::string& c : spec.choices) p.add_choices(c);
  p.set_strict(spec.strict);
  return p;
}

absl::StatusOr<model::SamplingParams> FromProto(const v1::SamplingParams& proto) {
  model::SamplingParams p;
  p.temperature = proto.temperature();
  p.top_p = proto.top_p() == 0.f ? 1.f : proto.top_p();
  p.top_k = proto.top_k();
  p.seed = proto.seed();
  p.max_tokens = proto.max_tokens() == 0 ? 16 : proto.max_tokens();
  p.stop_token_ids.assign(proto.stop_token_ids().begin(), proto.stop_token_ids().end());
  p.ignore_eos = proto.ignore_eos();
  p.logprobs = proto.logprobs();
  p.min_p = proto.min_p();
  p.repetition_penalty = proto.repetition_penalty() == 0.f ? 1.f : proto.repetition_penalty();
  p.presence_penalty = proto.presence_penalty();
  p.frequency_penalty = proto.frequency_penalty();
  for (const v1::LogitBias& b : proto.logit_bias()) {
    p.logit_bias.push_back({.id = b.token_id(), .bias = b.bias()});
  }
  // Increasing ids (SamplingParams::Validate refuses a repeated one).
  std::stable_sort(
      p.logit_bias.begin(), p.logit_bias.end(),
      [](const compute::LogitBias& a, const compute::LogitBias& b) { return a.id < b.id; });
  p.min_tokens = proto.min_tokens();
  p.prompt_logprobs = proto.has_prompt_logprobs() ? proto.prompt_logprobs() : -1;
  if (proto.has_grammar()) {
    DUET_ASSIGN_OR_RETURN(p.grammar, GrammarFromProto(proto.grammar()));
  }
  return p;
}

v1::SamplingParams ToProto(const model::SamplingParams& params) {
  v1::SamplingParams p;
  p.set_temperature(params.temperature);
  p.set_top_p(params.top_p);
  p.set_top_k(params.top_k);
  p.set_seed(params.seed);
  p.set_max_tokens(params.max_tokens);
  for (int32_t id : params.stop_token_ids) p.add_stop_token_ids(id);
  p.set_ignore_eos(params.ignore_eos);
  p.set_logprobs(params.logprobs);
  p.set_min_p(params.min_p);
  p.set_repetition_penalty(params.repetition_penalty);
  p.set_presence_penalty(params.presence_penalty);
  p.set_frequency_penalty(params.frequency_penalty);
  for (const compute::LogitBias& b : params.logit_bias) {
    v1::LogitBias* e = p.add_logit_bias();
    e->set_token_id(b.id);
    e->set_bias(b.bias);
  }
  p.set_min_tokens(params.min_tokens);
  if (params.prompt_logprobs >= 0) p.set_prompt_logprobs(params.prompt_logprobs);
  if (params.grammar.has_value()) *p.mutable_grammar() = GrammarToProto(*params.grammar);
  return p;
}

void AppendTokenLogprobs(const std::vector<model::SampledToken>& tokens,
                         google::protobuf::RepeatedPtrField<v1::TokenLogprob>* out) {
  out->Reserve(out->size() + static_cast<int>(tokens.size()));
  for (const model::SampledToken& t : tokens) {
    v1::TokenLogprob* p = out->Add();
    p->set_token_id(t.id);
    p->set_logprob(t.logprob);
    for (const auto& [id, lp] : t.top_logprobs) {
      v1::TopLogprob* top = p->add_top_logprobs();
      top->set_token_id(id);
      top->set_logprob(lp);
    }
  }
}

}  // namespace duet::rpc
