#include "proto/generate_request.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "proto/sampling_convert.h"

namespace duet::rpc {

absl::StatusOr<ClientPrompt> ParseGenerateRequest(const v1::GenerateRequest& req,
                                                  const model::Tokenizer& tokenizer,
                                                  const model::ModelConfig& config) {
  ClientPrompt out;
  if (req.has_token_ids()) {
    out.ids.assign(req.token_ids().ids().begin(), req.token_ids().ids().end());
  } else if (req.has_text()) {
    DUET_ASSIGN_OR_RETURN(out.ids, tokenizer.Encode(req.text(), /*add_bos=*/true));
  }
  DUET_RETURN_IF_ERROR(Annotate(config.CheckPrompt(out.ids), "Generate"));
  absl::StatusOr<model::SamplingParams> sampling = FromProto(req.sampling());
  if (!sampling.ok()) return Annotate(sampling.status(), "Generate");
  out.sampling = *std::move(sampling);
  DUET_RETURN_IF_ERROR(out.sampling.Validate(config.vocab_size));
  return out;
}

}  // namespace duet::rpc
