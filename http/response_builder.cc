#include "http/response_builder.h"

#include <utility>

namespace duet::http {

std::string TokenText(const model::Tokenizer& tok, int32_t id, bool skip_special) {
  if (skip_special && tok.IsControl(id)) return "";
  absl::StatusOr<std::string> s = tok.Decode({id});
  return s.ok() ? *s : "";
}

std::string ResponseBuilder::Consume(const v1::GenerateResponse& r, std::vector<TokenOut>* lp) {
  std::string piece;
  if (r.has_token() && !text_.stopped() && !req_.echo_only) {
    ++completion_tokens_;
    const std::string bytes = TokenText(r.token_id());
    // As vLLM: the stop token that ended the output (EOS, a stop_token_ids entry) is not text
    // unless include_stop_str_in_output.
    const bool stop_token = r.finish_reason() == v1::FINISH_REASON_EOS ||
                            r.finish_reason() == v1::FINISH_REASON_STOP_TOKEN;
    piece = text_.Add(stop_token && !req_.include_stop_str_in_output ? "" : bytes);
    if (req_.logprobs) {
      TokenOut t{.id = r.token_id(), .text = bytes, .logprob = r.logprob()};
      for (const v1::TopLogprob& top : r.top_logprobs()) {
        t.top.emplace_back(TokenText(top.token_id()), top.logprob());
      }
      lp->push_back(std::move(t));
    }
  }
  if (r.prompt_tokens() > 0) prompt_tokens_ = r.prompt_tokens();
  if (r.has_timings()) cached_tokens_ = r.timings().prefill_cached_tokens();
  if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    finish_reason_ = FinishReasonText(r.finish_reason());
  }
  if (text_.stopped()) finish_reason_ = "stop";
  if (req_.echo_only && !finish_reason_.empty()) finish_reason_ = "length";  // as vLLM
  full_text_ += piece;
  return piece;
}

std::string ResponseBuilder::Finish() {
  std::string rest = text_.Finish();
  full_text_ += rest;
  return rest;
}

}  // namespace duet::http
