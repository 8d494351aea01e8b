// The chat-only fields of an OpenAI request body, read for ParseRequest (openai_protocol.h):
// the messages (text content, an assistant's tool_calls, a tool message's tool_call_id), how
// they are rendered (add_generation_prompt, continue_final_message, chat_template_kwargs) and
// the tools (tools, tool_choice, parallel_tool_calls: tool_calls.h). Each problem is an ApiError
// naming the field.
//
//   if (auto e = ParseMessages(body, &req.messages)) reply(*e);
//   if (auto e = ParseChatRendering(Endpoint::kChat, body, &req.chat_rendering)) reply(*e);
//   if (auto e = ParseToolFields(Endpoint::kChat, body, body_text, &req)) reply(*e);
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/tokenizer/chat_template.h"
#include "http/openai_protocol.h"
#include "nlohmann/json.hpp"

namespace duet::http {

// `messages`: required, a non-empty array of {role, content, ...}; developer reads as system.
std::optional<ApiError> ParseMessages(const nlohmann::json& body, std::vector<ChatMessage>* out);

// add_generation_prompt, continue_final_message and chat_template_kwargs (enable_thinking only);
// on completions each is an error (chat only).
std::optional<ApiError> ParseChatRendering(Endpoint endpoint, const nlohmann::json& body,
                                           model::ChatRenderOptions* out);

// tools, tool_choice and parallel_tool_calls (chat only; `text` is the body as sent, read again
// with its keys in order); OpenAI's deprecated functions / function_call are refused by name.
// The tools go to out->chat_rendering, and tool_choice required or a named function becomes
// out->grammar.
std::optional<ApiError> ParseToolFields(Endpoint endpoint, const nlohmann::json& body,
                                        const std::string& text, ParsedRequest* out);

}  // namespace duet::http
