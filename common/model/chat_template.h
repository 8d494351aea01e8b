// Chat prompts without a Jinja engine: recognises the ChatML family of templates
// (<|im_start|>role\ncontent<|im_end|>\n, as SmolLM2 and Qwen2 ship) and renders one user turn
// with the template's default system message, followed by the assistant header.
//
//   DUET_ASSIGN_OR_RETURN(std::string prompt,
//                         ApplyChatTemplate(tok->chat_template(), "What is 2+2?"));
//   // "<|im_start|>system\nYou are ...<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
//   // "<|im_start|>assistant\n"
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace duet::model {

// Unimplemented (quoting the template's start) for templates that are not ChatML.
absl::StatusOr<std::string> ApplyChatTemplate(const std::string& chat_template,
                                              const std::string& user_message);

}  // namespace duet::model
