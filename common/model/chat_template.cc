#include "common/model/chat_template.h"

namespace duet::model {

absl::StatusOr<std::string> ApplyChatTemplate(const std::string& tmpl,
                                              const std::string& user_message) {
  if (tmpl.find("<|im_start|>") == std::string::npos ||
      tmpl.find("<|im_end|>") == std::string::npos) {
    return absl::UnimplementedError(
        "chat template '" + tmpl.substr(0, 80) + (tmpl.size() > 80 ? "...'" : "'") +
        " is not supported; only ChatML templates (<|im_start|>role ... <|im_end|>)");
  }
  std::string out;
  // The default system turn, when the template writes one literally (SmolLM2, Qwen2).
  const std::string sys = "<|im_start|>system\n";
  const size_t s = tmpl.find(sys);
  if (s != std::string::npos) {
    const size_t e = tmpl.find("<|im_end|>", s);
    if (e != std::string::npos) out = tmpl.substr(s, e - s) + "<|im_end|>\n";
  }
  out += "<|im_start|>user\n" + user_message + "<|im_end|>\n<|im_start|>assistant\n";
  return out;
}

}  // namespace duet::model
