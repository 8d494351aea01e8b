// duet.v1.SamplingParams <-> duet::model::SamplingParams, the one place the wire form of
// sampling options is interpreted (coordinator, prefill and decode nodes all use it).
// top_p 0 and repetition_penalty 0 on the wire mean "off" (1.0); logit_bias entries are sorted
// by token id.
//
//   model::SamplingParams p = duet::rpc::FromProto(request.sampling());
//   DUET_RETURN_IF_ERROR(p.Validate(vocab_size));
#pragma once

#include <vector>

#include "common/sampling/sampler.h"
#include "duet/v1/common.pb.h"

namespace duet::rpc {

model::SamplingParams FromProto(const v1::SamplingParams& proto);
v1::SamplingParams ToProto(const model::SamplingParams& params);

// Scored tokens (prompt logprobs) on the wire, appended to `out`.
void AppendTokenLogprobs(const std::vector<model::SampledToken>& tokens,
                         google::protobuf::RepeatedPtrField<v1::TokenLogprob>* out);

}  // namespace duet::rpc
