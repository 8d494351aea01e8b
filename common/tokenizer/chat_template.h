// Chat prompts without a Jinja engine: the model's chat template is recognised by its markers
// and the messages are rendered as that family's published template does (with
// add_generation_prompt), for:
// - ChatML (<|im_start|>role\ncontent<|im_end|>\n; SmolLM2, Qwen2): the template's literal
//   default system turn is kept when the messages have none;
// - Llama-3 (<|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>,
//   content trimmed; Llama-3.1+ templates with "Cutting Knowledge Date" always write the
//   system turn with that preamble and the template's default date);
// - Llama-2 ([INST] with <<SYS>>: the system turn folded into the first user turn, every user
//   turn starting with BOS, assistant turns followed by EOS);
// - Mistral ([INST] without <<SYS>>: BOS once, the system message folded into the first user
//   turn as mistral-common does, assistant turns followed by EOS);
// - Gemma (<start_of_turn>user\n...<end_of_turn>\n, assistant -> model, the system message
//   folded into the first user turn as Gemma 3 does; templates that refuse a system role
//   refuse it here too).
// Tools (ChatRenderOptions::tools, `tool` messages, assistant tool_calls) are rendered by the
// templates that render them, as their published Jinja does: ChatML templates with the Hermes
// <tool_call> format (Qwen2.5, Qwen3: the tools listed in the system turn, calls as <tool_call>
// JSON, results as <tool_response> in a user turn) and Llama-3.1+ templates (the tools in the
// first user message, one call per assistant turn as {"name", "parameters"}, results in ipython
// turns). Any other template given tools is InvalidArgument naming why.
// [INST] and Gemma templates require user/assistant alternation starting with a user turn:
// InvalidArgument otherwise. An empty template gives "role: content" lines; any other
// template is Unimplemented (quoting its start).
//
//   DUET_ASSIGN_OR_RETURN(std::string prompt,
//                         RenderChat(ChatTemplateOf(tokenizer), {{"user", "What is 2+2?"}}));
//   // SmolLM2: "<|im_start|>system\nYou are ...<|im_end|>\n<|im_start|>user\nWhat is 2+2?"
//   //          "<|im_end|>\n<|im_start|>assistant\n"
//   DUET_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.Encode(prompt, /*add_bos=*/true));
//
// A rendered prompt may begin with the BOS text (Llama-3, Llama-2, Mistral, Gemma);
// Tokenizer::Encode does not add a second BOS in front of it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace duet::model {

// A call an assistant message made (OpenAI's tool_calls[i]).
struct ChatToolCall {
  std::string id;
  std::string name;
  nlohmann::ordered_json arguments;  // the arguments, parsed from the client's JSON text
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool" (others pass through where allowed)
  std::string content;
  std::vector<ChatToolCall> tool_calls;  // assistant: the calls it made
  std::string tool_call_id;              // tool: the call this message answers
};

// The template and the texts it refers to as bos_token / eos_token. Empty token texts: the
// family's usual ones (<|begin_of_text|>, <s> and </s>, <bos>).
struct ChatTemplate {
  std::string source;  // Jinja source; empty: none
  std::string bos_token;
  std::string eos_token;
};

// The tokenizer's template with the texts of its BOS and (first) EOS tokens.
ChatTemplate ChatTemplateOf(const Tokenizer& tokenizer);

// How a conversation is rendered, as HF transformers' apply_chat_template takes it (and vLLM
// passes it on).
struct ChatRenderOptions {
  // End with the family's assistant header (ChatML, Llama-3, Gemma, the plain form); the [INST]
  // families have none (their prompt ends with [/INST] either way).
  bool add_generation_prompt = true;
  // Continue the last message instead of closing it: the rendered chat is cut right after that
  // message's content, as transformers does (so no end-of-turn token or EOS follows it).
  // Refused with add_generation_prompt (InvalidArgument).
  bool continue_final_message = false;
  // chat_template_kwargs.enable_thinking, for templates that read it (Qwen3): false writes the
  // empty think block after the generation prompt. Set for another template: InvalidArgument.
  std::optional<bool> enable_thinking;
  // The tools the model may call, each an OpenAI tool object ({"type": "function", "function":
  // {...}}) with its keys in the client's order, rendered as the template's `tojson` writes them.
  // Empty: none (a template without tool support then renders as before).
  std::vector<nlohmann::ordered_json> tools;
};

// Whether the template renders tools (and tool messages and calls): see above.
bool RendersTools(const std::string& chat_template_source);

absl::StatusOr<std::string> RenderChat(const ChatTemplate& chat_template,
                                       const std::vector<ChatMessage>& messages,
                                       const ChatRenderOptions& options = {});
// One user message.
absl::StatusOr<std::string> RenderChat(const ChatTemplate& chat_template,
                                       const std::string& user_message);

// The token that ends an assistant turn in the template's family ("<|im_end|>", "<|eot_id|>",
// "<end_of_turn>"), or empty (none, or the family ends turns with EOS).
std::string EndOfTurnToken(const std::string& chat_template_source);

}  // namespace duet::model
