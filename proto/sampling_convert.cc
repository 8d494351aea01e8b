#include "proto/sampling_convert.h"

#include <algorithm>

namespace duet::rpc {

model::SamplingParams FromProto(const v1::SamplingParams& proto) {
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
