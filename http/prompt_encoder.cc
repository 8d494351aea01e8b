#include "http/prompt_encoder.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace duet::http {
namespace {

model::ChatTemplate TemplateFor(const model::Tokenizer& tokenizer, const std::string& source) {
  model::ChatTemplate t = model::ChatTemplateOf(tokenizer);
  if (!source.empty()) t.source = source;
  return t;
}

}  // namespace

PromptEncoder::PromptEncoder(const model::Tokenizer* tokenizer, int32_t vocab_size,
                             const std::string& chat_template)
    : tokenizer_(tokenizer),
      vocab_size_(vocab_size > 0 ? vocab_size : tokenizer->vocab_size()),
      chat_template_(TemplateFor(*tokenizer, chat_template)) {}

std::optional<ApiError> PromptEncoder::PromptIds(const ParsedRequest& parsed,
                                                 const ParsedRequest::Prompt* prompt,
                                                 bool add_special, const std::string& param,
                                                 std::vector<int32_t>* ids) const {
  if (prompt != nullptr && prompt->is_ids) {
    for (int32_t id : prompt->ids) {
      if (id >= vocab_size_) {
        return ApiError{
            .message = absl::StrCat("token id ", id, " is outside the vocabulary of ", vocab_size_),
            .param = param,
            .code = "invalid_value"};
      }
    }
    *ids = prompt->ids;
    return std::nullopt;
  }
  std::string text;
  if (prompt != nullptr) {
    text = prompt->text;
  } else {
    absl::StatusOr<std::string> chat =
        model::RenderChat(chat_template_, parsed.messages, parsed.chat_rendering);
    if (!chat.ok()) {
      ApiError e = ErrorFromStatus(chat.status());
      if (e.param.empty()) e.param = "messages";  // the template refused the conversation
      return e;
    }
    text = *std::move(chat);
  }
  absl::StatusOr<std::vector<int32_t>> enc = tokenizer_->Encode(text, add_special);
  if (!enc.ok()) return ErrorFromStatus(enc.status());
  *ids = *std::move(enc);
  return std::nullopt;
}

std::string PromptEncoder::EchoText(const ParsedRequest::Prompt& prompt) const {
  if (!prompt.is_ids) return prompt.text;
  std::vector<int32_t> ids;
  for (int32_t id : prompt.ids) {
    if (!tokenizer_->IsControl(id)) ids.push_back(id);
  }
  absl::StatusOr<std::string> text = tokenizer_->Decode(ids);
  return text.ok() ? *text : "";
}

std::optional<ApiError> PromptEncoder::Detokenize(const nlohmann::json& tokens,
                                                  std::string* text) const {
  std::vector<int32_t> ids;
  for (const nlohmann::json& t : tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab_size_) {
      return ApiError{
          .message = absl::StrCat("'tokens' holds ", t.dump(),
                                  ", not a token id of the vocabulary of ", vocab_size_),
          .param = "tokens",
          .code = "invalid_value"};
    }
    ids.push_back(t.get<int32_t>());
  }
  absl::StatusOr<std::string> decoded = tokenizer_->Decode(ids);
  if (!decoded.ok()) return ErrorFromStatus(decoded.status());
  *text = *std::move(decoded);
  return std::nullopt;
}

}  // namespace duet::http
