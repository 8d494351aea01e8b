#include "common/tokenizer/chat_template.h"

#include <algorithm>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/json_util.h"
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

// The template's literal default system content (SmolLM2, Qwen2.5), if it writes one: the first
// system header followed by text within the same string literal up to <|im_end|> (a quote means
// an expression, as Qwen3's '<|im_start|>system\n' + messages[0].content). The literal's newline
// is a real one or Jinja's escape (a backslash and n), as templates differ.
std::optional<std::string> DefaultSystem(const std::string& tmpl) {
  for (const std::string sys : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
    for (size_t s = tmpl.find(sys); s != std::string::npos; s = tmpl.find(sys, s + 1)) {
      const size_t e = tmpl.find("<|im_end|>", s);
      if (e == std::string::npos) break;
      const std::string text = tmpl.substr(s + sys.size(), e - s - sys.size());
      if (text.find_first_of("'\"") != std::string::npos) continue;
      return absl::StrReplaceAll(text, {{"\\n", "\n"}});
    }
  }
  return std::nullopt;
}

bool HasToolParts(const std::vector<ChatMessage>& messages) {
  return std::any_of(messages.begin(), messages.end(), [](const ChatMessage& m) {
    return m.role == "tool" || !m.tool_calls.empty();
  });
}

// The Hermes tool prompt of Qwen2.5 / Qwen3 templates, after the system text.
std::string HermesToolsPrompt(const std::vector<nlohmann::ordered_json>& tools) {
  std::string out =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
      "provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (const nlohmann::ordered_json& tool : tools)
    absl::StrAppend(&out, "\n", PythonJsonDumps(tool));
  return out +
         "\n</tools>\n\nFor each function call, return a json object with function name and "
         "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
         "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
}

std::string RenderChatMl(const std::string& tmpl, const std::vector<ChatMessage>& messages,
                         const std::vector<nlohmann::ordered_json>& tools) {
  std::string out;
  size_t first = 0;  // the first message the loop renders
  if (!tools.empty()) {
    // A system turn of its own: the system text (the first message's, else the template's
    // default), then the tools.
    out = "<|im_start|>system\n";
    if (!messages.empty() && messages[0].role == "system") {
      absl::StrAppend(&out, messages[0].content, "\n\n");
      first = 1;
    } else if (std::optional<std::string> d = DefaultSystem(tmpl)) {
      absl::StrAppend(&out, *d, "\n\n");
    }
    out += HermesToolsPrompt(tools);
  } else if (std::none_of(messages.begin(), messages.end(),
                          [](const ChatMessage& m) { return m.role == "system"; })) {
    if (std::optional<std::string> d = DefaultSystem(tmpl)) {
      absl::StrAppend(&out, "<|im_start|>system\n", *d, "<|im_end|>\n");
    }
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      // Consecutive tool results share one user turn.
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      absl::StrAppend(&out, "\n<tool_response>\n", m.content, "\n</tool_response>");
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    } else if (m.role == "assistant" && !m.tool_calls.empty()) {
      out += "<|im_start|>assistant";
      if (!m.content.empty()) absl::StrAppend(&out, "\n", m.content);
      for (const ChatToolCall& call : m.tool_calls) {
        absl::StrAppend(&out, "\n<tool_call>\n{\"name\": \"", call.name,
                        "\", \"arguments\": ", PythonJsonDumps(call.arguments), "}\n</tool_call>");
      }
      out += "<|im_end|>\n";
    } else {
      absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
    }
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

absl::StatusOr<std::string> RenderLlama3(const ChatTemplate& t,
                                         const std::vector<ChatMessage>& messages,
                                         const std::vector<nlohmann::ordered_json>& tools) {
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
    turn("system", absl::StrCat(tools.empty() ? "" : "Environment: ipython\n",
                                "Cutting Knowledge Date: December 2023\nToday Date: ",
                                Llama31Date(t.source), "\n\n", Trim(c.system.value_or(""))));
  }
  if (!tools.empty()) {
    // The tools go into the first message after the system one, written as a user turn.
    if (turns.empty()) {
      return absl::InvalidArgumentError(
          "the Llama-3 chat template puts the tools in the first user message, and the messages "
          "have none");
    }
    std::string first =
        "Given the following functions, please respond with a JSON for a function call with its "
        "proper arguments that best answers the given prompt.\n\nRespond in the format "
        "{\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do "
        "not use variables.\n\n";
    for (const nlohmann::ordered_json& tool : tools) {
      absl::StrAppend(&first, PythonJsonDumps(tool, /*indent=*/4), "\n\n");
    }
    turn("user", first + Trim(turns[0].content));
    turns.erase(turns.begin());
  }
  for (const ChatMessage& m : turns) {
    if (m.role == "tool" || m.role == "ipython") {
      // The template writes the content with tojson (a string is iterable in Jinja).
      turn("ipython", PythonJsonDumps(nlohmann::ordered_json(m.content)));
    } else if (!m.tool_calls.empty()) {
      if (m.tool_calls.size() != 1) {
        return absl::InvalidArgumentError(
            "the Llama-3 chat template renders one tool call per assistant message");
      }
      const ChatToolCall& call = m.tool_calls[0];
      turn("assistant", absl::StrCat("{\"name\": \"", call.name,
                                     "\", \"parameters\": ", PythonJsonDumps(call.arguments), "}"));
    } else {
      turn(m.role, Trim(m.content));
    }
  }
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
                                                       const std::vector<ChatMessage>& messages,
                                                       const ChatRenderOptions& options) {
  if ((!options.tools.empty() || HasToolParts(messages)) && !RendersTools(t.source)) {
    return absl::InvalidArgumentError(
        "the model's chat template does not render tools, tool messages or tool calls (duet "
        "renders them for ChatML templates with the <tool_call> format, as Qwen2.5 and Qwen3 "
        "have, and for Llama-3.1+ templates; a server may name such a template with "
        "--chat_template)");
  }
  switch (FamilyOf(t.source)) {
    case Family::kNone: {
      std::string out;
      for (const ChatMessage& m : messages) absl::StrAppend(&out, m.role, ": ", m.content, "\n");
      return out + "assistant:";
    }
    case Family::kChatMl:
      return RenderChatMl(t.source, messages, options.tools);
    case Family::kLlama3:
      return RenderLlama3(t, messages, options.tools);
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
  DUET_ASSIGN_OR_RETURN(std::string out, RenderWithGenerationPrompt(t, messages, options));
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

bool RendersTools(const std::string& chat_template_source) {
  switch (FamilyOf(chat_template_source)) {
    case Family::kChatMl:
      return Has(chat_template_source, "<tool_call>");
    case Family::kLlama3:
      return Has(chat_template_source, "Given the following functions");
    default:
      return false;
  }
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
