// The checks every client front end (the coordinator, the colocated server) makes on a
// duet.v1.GenerateRequest before it takes any resource, so both answer bad input with the same
// status: the prompt (text tokenized with BOS, or token ids) must be non-empty, inside the
// vocabulary and shorter than the context; the sampling options must be valid.
//
//   DUET_ASSIGN_OR_RETURN(rpc::ClientPrompt p, rpc::ParseGenerateRequest(req, *tokenizer, config));
//   // p.ids: the prompt's token ids; p.sampling: the request's sampling options
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/model_config.h"
#include "common/sampling/sampler.h"
#include "common/tokenizer/tokenizer.h"
#include "duet/v1/client.pb.h"

namespace duet::rpc {

struct ClientPrompt {
  std::vector<int32_t> ids;
  model::SamplingParams sampling;
};

// InvalidArgument ("Generate: ...") on bad input; the tokenizer's error on untokenizable text.
absl::StatusOr<ClientPrompt> ParseGenerateRequest(const v1::GenerateRequest& req,
                                                  const model::Tokenizer& tokenizer,
                                                  const model::ModelConfig& config);

}  // namespace duet::rpc
