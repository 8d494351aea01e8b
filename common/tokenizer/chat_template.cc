#include "common/tokenizer/chat_template.h"

#include <algorithm>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/status.h"

namespace duet::model {
namespace {

enum class Family { kNone, kChatMl, kLlama3, kLlama2, kMistral, kGemma, kUnknown };

bool Has(const std::string& s, std::string_view what) { return s.find(what) != std::string::npos; }

Family FamilyOf(const std::string& tmpl) {
  if (tmpl.empty()) return Family::kNone;
  if (Has(tmpl, "<|im_start|>") && Has(tmpl, "<|im_end|>")) return Family::kChatMl;
  if (Has(tmpl, "<|start_header_id|>") && Has(tmpl, "<|eot_id|>")) return Family::kLlama3;
  if (Has(tmpl, "<start_of_turn>") && Has(tmpl, "<end_of_turn>")) return Family::kGemma;
  if (Has(tmpl, "[INST]") && Has(tmpl, "[/INST]")) {
    return Has(tmpl, "<<SYS>>") ? Family::kLlama2 : Family::kMistral;
  }
  return Family::kUnknown;
}

// Jinja's `| trim` and Python's str.strip(): leading and trailing whitespace.
std::string Trim(const std::string& s) { return std::string(absl::StripAsciiWhitespace(s)); }

std::string Or(const std::string& s, const char* fallback) { return s.empty() ? fallback : s; }

struct Conversation {
  std::optional<std::string> system;  // a leading system message's content
  std::vector<ChatMessage> turns;     // the messages after it
};

Conversation SplitSystem(const std::vector<ChatMessage>& messages) {
  if (messages.empty() || messages[0].role != "system") return {std::nullopt, messages};
  return {messages[0].content, std::vector<ChatMessage>(messages.begin() + 1, messages.end())};
}

// The [INST] and Gemma templates' rule: user, assistant, user, ... (after the system message).
absl::Status CheckAlternation(const std::vector<ChatMessage>& turns, const char* family) {
  for (size_t i = 0; i < turns.size(); ++i) {
    const char* want = i % 2 == 0 ? "user" : "assistant";
    if (turns[i].role != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ", family, " chat template needs roles alternating user/assistant/user/... ",
          "after an optional first system message; message ", i, " has role '", turns[i].role,
          "' where '", want, "' is expected"));
    }
  }
  if (turns.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", family,
                     " chat template needs roles alternating "
                     "user/assistant/user/... and at least one user message"));
  }
  return absl::OkStatus();
}

std::string RenderChatMl(const std::string& tmpl, const std::vector<ChatMessage>& messages) {
  const bool has_system = std::any_of(messages.begin(), messages.end(),
                                      [](const ChatMessage& m) { return m.role == "system"; });
  std::string out;
  if (!has_system) {
    // The template's default system turn, when it writes one literally (SmolLM2, Qwen2).
    const std::string sys = "<|im_start|>system\n";
    const size_t s = tmpl.find(sys);
    if (s != std::string::npos) {
      const size_t e = tmpl.find("<|im_end|>", s);
      if (e != std::string::npos) out = tmpl.substr(s, e - s) + "<|im_end|>\n";
    }
  }
  for (const ChatMessage& m : messages) {
    absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
  }
  return out + "<|im_start|>assistant\n";
}

// Llama-3.1+ templates set a default date ({%- set date_string = "26 Jul 2024" %}) unless
// strftime_now exists, as it does under HF transformers and llama.cpp.
std::string Llama31Date(const std::string& tmpl) {
  if (Has(tmpl, "strftime_now")) {
    return absl::FormatTime("%d %b %Y", absl::Now(), absl::UTCTimeZone());
  }
  const std::string key = "set date_string = \"";
  const size_t s = tmpl.find(key);
  if (s == std::string::npos) return "26 Jul 2024";
  const size_t b = s + key.size();
  const size_t e = tmpl.find('"', b);
  return e == std::string::npos ? "26 Jul 2024" : tmpl.substr(b, e - b);
}

std::string RenderLlama3(const ChatTemplate& t, const std::vector<ChatMessage>& messages) {
  std::string out = Or(t.bos_token, "<|begin_of_text|>");
  auto turn = [&](const std::string& role, const std::string& content) {
    absl::StrAppend(&out, "<|start_header_id|>", role, "<|end_header_id|>\n\n", content,
                    "<|eot_id|>");
  };
  std::vector<ChatMessage> turns = messages;
  if (Has(t.source, "Cutting Knowledge Date")) {
    // Llama-3.1/3.2: a system turn always, with the knowledge cutoff and date first.
    Conversation c = SplitSystem(messages);
    turns = std::move(c.turns);
    turn("system", absl::StrCat("Cutting Knowledge Date: December 2023\nToday Date: ",
                                Llama31Date(t.source), "\n\n", Trim(c.system.value_or(""))));
  }
  for (const ChatMessage& m : turns) turn(m.role, Trim(m.content));
  return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

absl::StatusOr<std::string> RenderLlama2(const ChatTemplate& t,
                                         const std::vector<ChatMessage>& messages) {
  const auto [system, turns] = SplitSystem(messages);
  DUET_RETURN_IF_ERROR(CheckAlternation(turns, "Llama-2"));
  const std::string bos = Or(t.bos_token, "<s>");
  const std::string eos = Or(t.eos_token, "</s>");
  std::string out;
  for (size_t i = 0; i < turns.size(); ++i) {
    std::string content = turns[i].content;
    if (i == 0 && system) content = "<<SYS>>\n" + *system + "\n<</SYS>>\n\n" + content;
    if (turns[i].role == "user") {
      absl::StrAppend(&out, bos, "[INST] ", Trim(content), " [/INST]");
    } else {
      absl::StrAppend(&out, " ", Trim(content), " ", eos);
    }
  }
  return out;
}

absl::StatusOr<std::string> RenderMistral(const ChatTemplate& t,
                                          const std::vector<ChatMessage>& messages) {
  const auto [system, turns] = SplitSystem(messages);
  DUET_RETURN_IF_ERROR(CheckAlternation(turns, "Mistral"));
  std::string out = Or(t.bos_token, "<s>");
  const std::string eos = Or(t.eos_token, "</s>");
  for (size_t i = 0; i < turns.size(); ++i) {
    if (turns[i].role == "user") {
      const std::string prefix = i == 0 && system ? *system + "\n\n" : "";
      absl::StrAppend(&out, "[INST] ", prefix, turns[i].content, " [/INST]");
    } else {
      absl::StrAppend(&out, turns[i].content, eos);
    }
  }
  return out;
}

absl::StatusOr<std::string> RenderGemma(const ChatTemplate& t,
                                        const std::vector<ChatMessage>& messages) {
  const auto [system, turns] = SplitSystem(messages);
  if (system && Has(t.source, "System role not supported")) {
    return absl::InvalidArgumentError(
        "the model's Gemma chat template does not support a system message");
  }
  DUET_RETURN_IF_ERROR(CheckAlternation(turns, "Gemma"));
  std::string out = Or(t.bos_token, "<bos>");
  for (size_t i = 0; i < turns.size(); ++i) {
    const char* role = turns[i].role == "assistant" ? "model" : "user";
    const std::string prefix = i == 0 && system ? *system + "\n\n" : "";
    absl::StrAppend(&out, "<start_of_turn>", role, "\n", prefix, Trim(turns[i].content),
                    "<end_of_turn>\n");
  }
  return out + "<start_of_turn>model\n";
}

}  // namespace

ChatTemplate ChatTemplateOf(const Tokenizer& tokenizer) {
  ChatTemplate t;
  t.source = tokenizer.chat_template();
  auto text_of = [&](int32_t id) -> std::string {
    if (id < 0) return "";
    absl::StatusOr<std::string> s = tokenizer.Decode({id});
    return s.ok() ? *s : "";
  };
  t.bos_token = text_of(tokenizer.bos_id());
  const std::vector<int32_t> eos = tokenizer.eos_ids();
  if (!eos.empty()) t.eos_token = text_of(eos.front());
  return t;
}

namespace {

// The assistant header a family's renderer ends with (empty for the [INST] families).
std::string GenerationPrompt(Family family) {
  switch (family) {
    case Family::kNone:
      return "assistant:";
    case Family::kChatMl:
      return "<|im_start|>assistant\n";
    case Family::kLlama3:
      return "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case Family::kGemma:
      return "<start_of_turn>model\n";
    default:
      return "";
  }
}

absl::StatusOr<std::string> RenderWithGenerationPrompt(const ChatTemplate& t,
                                                       const std::vector<ChatMessage>& messages) {
  switch (FamilyOf(t.source)) {
    case Family::kNone: {
      std::string out;
      for (const ChatMessage& m : messages) absl::StrAppend(&out, m.role, ": ", m.content, "\n");
      return out + "assistant:";
    }
    case Family::kChatMl:
      return RenderChatMl(t.source, messages);
    case Family::kLlama3:
      return RenderLlama3(t, messages);
    case Family::kLlama2:
      return RenderLlama2(t, messages);
    case Family::kMistral:
      return RenderMistral(t, messages);
    case Family::kGemma:
      return RenderGemma(t, messages);
    case Family::kUnknown:
      break;
  }
  return absl::UnimplementedError(absl::StrCat(
      "the model's chat template '", t.source.substr(0, 80), t.source.size() > 80 ? "...'" : "'",
      " is not supported; supported: ChatML, Llama-3, Llama-2/Mistral [INST], Gemma"));
}

}  // namespace

absl::StatusOr<std::string> RenderChat(const ChatTemplate& t,
                                       const std::vector<ChatMessage>& messages,
                                       const ChatRenderOptions& options) {
  if (options.continue_final_message && options.add_generation_prompt) {
    return absl::InvalidArgumentError(
        "continue_final_message and add_generation_prompt cannot both be set (the final message "
        "is either continued or followed by a new assistant turn)");
  }
  if (options.continue_final_message && messages.empty()) {
    return absl::InvalidArgumentError("continue_final_message needs a final message");
  }
  if (options.enable_thinking.has_value() && !Has(t.source, "enable_thinking")) {
    return absl::InvalidArgumentError(
        "chat_template_kwargs.enable_thinking: the model's chat template does not read it");
  }
  DUET_ASSIGN_OR_RETURN(std::string out, RenderWithGenerationPrompt(t, messages));
  const std::string prompt = GenerationPrompt(FamilyOf(t.source));
  if (!options.add_generation_prompt) {
    if (!prompt.empty() && absl::EndsWith(out, prompt)) out.resize(out.size() - prompt.size());
  } else if (options.enable_thinking == false) {
    out += "<think>\n\n</think>\n\n";  // Qwen3's template, thinking off
  }
  if (options.continue_final_message) {
    // As transformers: cut after the last occurrence of the final message's content (as written,
    // else stripped, since some families trim it).
    const std::string& final_content = messages.back().content;
    const std::string stripped = Trim(final_content);
    size_t at = final_content.empty() ? std::string::npos : out.rfind(final_content);
    size_t len = final_content.size();
    if (at == std::string::npos && !stripped.empty()) {
      at = out.rfind(stripped);
      len = stripped.size();
    }
    if (at == std::string::npos) {
      return absl::InvalidArgumentError(
          "continue_final_message: the final message does not appear in the rendered chat (an "
          "empty final message cannot be continued)");
    }
    out.resize(at + len);
  }
  return out;
}

absl::StatusOr<std::string> RenderChat(const ChatTemplate& t, const std::string& user_message) {
  return RenderChat(t, std::vector<ChatMessage>{{"user", user_message}});
}

std::string EndOfTurnToken(const std::string& chat_template_source) {
  switch (FamilyOf(chat_template_source)) {
    case Family::kChatMl:
      return "<|im_end|>";
    case Family::kLlama3:
      return "<|eot_id|>";
    case Family::kGemma:
      return "<end_of_turn>";
    default:
      return "";
  }
}

}  // namespace duet::model
