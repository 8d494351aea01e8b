// duet.v1.SamplingParams <-> duet::model::SamplingParams, the one place the wire form of
// sampling options is interpreted (coordinator, prefill and decode nodes all use it).
// top_p 0 and repetition_penalty 0 on the wire mean "off" (1.0); logit_bias entries are sorted
// by token id; a grammar whose kind is unset or unknown is refused (InvalidArgument naming it).
//
//   DUET_ASSIGN_OR_RETURN(model::SamplingParams p, duet::rpc::FromProto(request.sampling()));
//   DUET_RETURN_IF_ERROR(p.Validate(vocab_size));
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "common/grammar/grammar_spec.h"
#include "common/sampling/sampler.h"
#include "duet/v1/common.pb.h"

namespace duet::rpc {

absl::StatusOr<model::SamplingParams> FromProto(const v1::SamplingParams& proto);
v1::SamplingParams ToProto(const model::SamplingParams& params);
absl::StatusOr<grammar::GrammarSpec> GrammarFromProto(const v1::GrammarSpec& proto);
v1::GrammarSpec GrammarToProto(const grammar::GrammarSpec& spec);

// Scored tokens (prompt logprobs) on the wire, appended to `out`.
void AppendTokenLogprobs(const std::vector<model::SampledToken>& tokens,
                         google::protobuf::RepeatedPtrField<v1::TokenLogprob>* out);

}  // namespace duet::rpc
