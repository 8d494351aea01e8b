// ResponseBuilder: one choice's OpenAI text, logprobs, finish reason and usage, built from the
// backend's GenerateResponses as they arrive (stop strings applied by TextAssembler). Used by
// the HTTP front, one per choice.
//
//   ResponseBuilder b(parsed_request, tokenizer);
//   for (const v1::GenerateResponse& r : responses) send(b.Consume(r, &logprobs));
//   send(b.Finish());  // text held back for a stop string that did not complete
//   b.finish_reason(); b.usage(prompt_tokens);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "duet/v1/client.pb.h"
#include "http/openai_protocol.h"

namespace duet::http {

// A token's text as responses show it: control tokens (BOS, EOS, ...) are empty unless
// `skip_special` is false (skip_special_tokens: false).
std::string TokenText(const model::Tokenizer& tok, int32_t id, bool skip_special = true);

class ResponseBuilder {
 public:
  ResponseBuilder(const ParsedRequest& req, const model::Tokenizer* tok)
      : req_(req), tok_(tok), text_(req.stop, req.include_stop_str_in_output) {}

  // Consumes one response; returns the text that may be sent now and, when logprobs were
  // asked for, this token's entry in *lp.
  std::string Consume(const v1::GenerateResponse& r, std::vector<TokenOut>* lp);
  // The text held back (a stop string's prefix that never completed).
  std::string Finish();
  bool stopped() const { return text_.stopped(); }
  const std::string& finish_reason() const { return finish_reason_; }
  const std::string& full_text() const { return full_text_; }
  Usage usage(int64_t prompt_tokens) const {
    return Usage{.prompt_tokens = prompt_tokens_ > 0 ? prompt_tokens_ : prompt_tokens,
                 .completion_tokens = completion_tokens_,
                 .cached_tokens = cached_tokens_};
  }

 private:
  std::string TokenText(int32_t id) const {
    return http::TokenText(*tok_, id, req_.skip_special_tokens);
  }

  const ParsedRequest& req_;
  const model::Tokenizer* tok_;
  TextAssembler text_;
  int64_t completion_tokens_ = 0;
  int64_t prompt_tokens_ = 0;
  int64_t cached_tokens_ = 0;
  std::string finish_reason_;
  std::string full_text_;
};

}  // namespace duet::http
