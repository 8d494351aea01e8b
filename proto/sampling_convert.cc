#include "proto/sampling_convert.h"

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
  return p;
}

}  // namespace duet::rpc
