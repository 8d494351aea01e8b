// PromptEncoder: what the HTTP front prefills a request with, and the text it shows for ids: a
// completions prompt tokenized (or its ids checked against the vocabulary), chat messages
// rendered with the chat template (the model's, or the server's --chat_template) and tokenized,
// the text `echo` puts before a completion, and /detokenize's ids as text.
//
//   PromptEncoder prompts(&tokenizer, /*vocab_size=*/0, /*chat_template=*/"");
//   std::vector<int32_t> ids;
//   if (auto e = prompts.PromptIds(parsed, /*prompt=*/nullptr, true, "messages", &ids)) reply(*e);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "http/openai_protocol.h"
#include "nlohmann/json.hpp"

namespace duet::http {

class PromptEncoder {
 public:
  // `vocab_size`: the model's (its embedding rows; 0: the tokenizer's size). `chat_template`:
  // a template source in place of the model's (empty: the model's).
  PromptEncoder(const model::Tokenizer* tokenizer, int32_t vocab_size,
                const std::string& chat_template);

  int32_t vocab_size() const { return vocab_size_; }

  // The token ids of a completions prompt (`prompt`), or of the chat messages rendered with the
  // template (`prompt` null). `param` names the prompt in errors; a template's refusal names
  // "messages".
  std::optional<ApiError> PromptIds(const ParsedRequest& parsed,
                                    const ParsedRequest::Prompt* prompt, bool add_special,
                                    const std::string& param, std::vector<int32_t>* ids) const;

  // The text `echo` puts before a completion: the prompt as given, or its ids decoded (control
  // tokens such as BOS are not text).
  std::string EchoText(const ParsedRequest::Prompt& prompt) const;

  // /detokenize's `tokens` (an array of ids of the vocabulary) as text.
  std::optional<ApiError> Detokenize(const nlohmann::json& tokens, std::string* text) const;

 private:
  const model::Tokenizer* const tokenizer_;
  const int32_t vocab_size_;
  const model::ChatTemplate chat_template_;
};

}  // namespace duet::http
