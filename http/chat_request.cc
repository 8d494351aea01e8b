#include "http/chat_request.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "http/request_errors.h"
#include "http/tool_calls.h"

namespace duet::http {
namespace {

using nlohmann::json;

std::optional<ApiError> GetContent(const json& m, size_t index, std::string* out) {
  const std::string field = absl::StrCat("messages[", index, "].content");
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) {
    *out = "";
    return std::nullopt;
  }
  if (it->is_string()) {
    *out = it->get<std::string>();
    return std::nullopt;
  }
  if (!it->is_array()) return WrongType(field, "a string or an array of parts", *it);
  out->clear();
  for (const json& part : *it) {
    if (!part.is_object()) return WrongType(field + "[]", "an object", part);
    auto type = part.find("type");
    auto text = part.find("text");
    if (type == part.end() || !type->is_string() || type->get<std::string>() != "text" ||
        text == part.end() || !text->is_string()) {
      return Invalid(absl::StrCat("only text parts ({\"type\": \"text\", \"text\": ...}) are "
                                  "supported in ",
                                  field),
                     field, "invalid_value");
    }
    *out += text->get<std::string>();
  }
  return std::nullopt;
}

// An assistant message's tool_calls and a tool message's tool_call_id.
std::optional<ApiError> GetToolParts(const json& m, size_t index, ChatMessage* msg) {
  const std::string prefix = absl::StrCat("messages[", index, "]");
  if (auto id = m.find("tool_call_id"); id != m.end() && !id->is_null()) {
    if (msg->role != "tool") {
      return Invalid(absl::StrCat(prefix, ".tool_call_id belongs to a tool message"),
                     prefix + ".tool_call_id", "invalid_value");
    }
    if (!id->is_string()) return WrongType(prefix + ".tool_call_id", "a string", *id);
    msg->tool_call_id = id->get<std::string>();
  }
  auto calls = m.find("tool_calls");
  if (calls == m.end() || calls->is_null()) return std::nullopt;
  const std::string field = prefix + ".tool_calls";
  if (msg->role != "assistant") {
    return Invalid(field + " belongs to an assistant message", field, "invalid_value");
  }
  if (!calls->is_array()) return WrongType(field, "an array", *calls);
  for (size_t k = 0; k < calls->size(); ++k) {
    const json& c = (*calls)[k];
    const std::string f = absl::StrCat(field, "[", k, "]");
    auto fn = c.is_object() ? c.find("function") : c.end();
    if (!c.is_object() || fn == c.end() || !fn->is_object() || !fn->contains("name") ||
        !(*fn)["name"].is_string()) {
      return Invalid(f + " must be {\"id\", \"type\": \"function\", \"function\": {\"name\", "
                         "\"arguments\"}}",
                     f, "invalid_value");
    }
    model::ChatToolCall call{.name = (*fn)["name"].get<std::string>()};
    if (auto id = c.find("id"); id != c.end() && id->is_string()) call.id = id->get<std::string>();
    // arguments: JSON text (OpenAI's form; parsed, as vLLM does before rendering) or an object.
    auto args = fn->find("arguments");
    if (args != fn->end() && args->is_string()) {
      const std::string& text = args->get_ref<const std::string&>();
      call.arguments = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (call.arguments.is_discarded()) {
        return Invalid(f + ".function.arguments is not JSON text", f + ".function.arguments",
                       "invalid_value");
      }
    } else if (args != fn->end() && args->is_object()) {
      call.arguments = nlohmann::ordered_json::parse(args->dump());
    } else {
      return Invalid(f + ".function.arguments must be JSON text (or an object)",
                     f + ".function.arguments", "invalid_value");
    }
    msg->tool_calls.push_back(std::move(call));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseMessages(const json& j, std::vector<ChatMessage>* out) {
  auto it = j.find("messages");
  if (it == j.end() || it->is_null()) return Invalid("'messages' is required", "messages");
  if (!it->is_array()) return WrongType("messages", "an array", *it);
  if (it->empty()) return Invalid("'messages' is empty", "messages", "invalid_value");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    if (!m.is_object()) return WrongType(absl::StrCat("messages[", i, "]"), "an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return Invalid(absl::StrCat("messages[", i, "].role must be a string"),
                     absl::StrCat("messages[", i, "].role"), "invalid_type");
    }
    ChatMessage msg{.role = role->get<std::string>()};
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" &&
        msg.role != "developer" && msg.role != "tool") {
      return Invalid(absl::StrCat("messages[", i, "].role '", msg.role,
                                  "' is not one of system, developer, user, assistant, tool"),
                     absl::StrCat("messages[", i, "].role"), "invalid_value");
    }
    if (msg.role == "developer") msg.role = "system";
    if (auto e = GetContent(m, i, &msg.content)) return e;
    if (auto e = GetToolParts(m, i, &msg)) return e;
    out->push_back(std::move(msg));
  }
  return std::nullopt;
}

// How chat messages become the prompt, as vLLM takes it: add_generation_prompt,
// continue_final_message and the chat_template_kwargs duet's renderer reads (enable_thinking).
std::optional<ApiError> ParseChatRendering(Endpoint endpoint, const json& j,
                                           model::ChatRenderOptions* out) {
  if (endpoint != Endpoint::kChat) {
    for (const char* field :
         {"add_generation_prompt", "continue_final_message", "chat_template_kwargs"}) {
      if (auto it = j.find(field); it != j.end() && !it->is_null()) {
        return Invalid(absl::StrCat("'", field, "' applies to chat completions only"), field,
                       "invalid_value");
      }
    }
    return std::nullopt;
  }
  if (auto e = GetBool(j, "add_generation_prompt", &out->add_generation_prompt)) return e;
  if (auto e = GetBool(j, "continue_final_message", &out->continue_final_message)) return e;
  if (out->add_generation_prompt && out->continue_final_message) {
    return Invalid(
        "'continue_final_message' needs 'add_generation_prompt': false (the final message is "
        "either continued or followed by a new assistant turn)",
        "continue_final_message", "invalid_value");
  }
  auto it = j.find("chat_template_kwargs");
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return WrongType("chat_template_kwargs", "an object", *it);
  for (const auto& [key, value] : it->items()) {
    if (key == "enable_thinking") {
      if (!value.is_boolean()) {
        return WrongType("chat_template_kwargs.enable_thinking", "a boolean", value);
      }
      out->enable_thinking = value.get<bool>();
      continue;
    }
    return Invalid(absl::StrCat("'chat_template_kwargs.", key,
                                "' is not supported (duet renders chat templates without Jinja "
                                "and reads only enable_thinking)"),
                   "chat_template_kwargs", "unsupported");
  }
  return std::nullopt;
}

// tools, tool_choice, parallel_tool_calls (chat only): the tools go to the chat template, and
// tool_choice required or a named function becomes the request's grammar.
std::optional<ApiError> ParseToolFields(Endpoint endpoint, const json& j, const std::string& body,
                                        ParsedRequest* out) {
  const char* fields[] = {"functions", "function_call", "tools", "tool_choice",
                          "parallel_tool_calls"};
  if (std::none_of(std::begin(fields), std::end(fields), [&](const char* f) {
        auto it = j.find(f);
        return it != j.end() && !it->is_null();
      })) {
    return std::nullopt;
  }
  for (const char* legacy : {"functions", "function_call"}) {
    if (auto it = j.find(legacy); it != j.end() && !it->is_null()) {
      return Invalid(absl::StrCat("'", legacy,
                                  "' (OpenAI's deprecated function calling) is not supported; "
                                  "use 'tools' and 'tool_choice'"),
                     legacy, "unsupported");
    }
  }
  if (endpoint != Endpoint::kChat) {
    for (const char* f : fields) {
      if (auto it = j.find(f); it != j.end() && !it->is_null()) {
        return Invalid(absl::StrCat("'", f, "' applies to chat completions only"), f,
                       "invalid_value");
      }
    }
  }
  // Again with the keys in the client's order: the template writes the tools as sent.
  const nlohmann::ordered_json ordered =
      nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (auto e = ParseTools(ordered, &out->tools)) return e;
  out->chat_rendering.tools = out->tools.tools;
  if (std::optional<grammar::GrammarSpec> g = ToolGrammar(out->tools)) {
    if (out->grammar) {
      return Invalid(
          "'tool_choice' required or a named function is enforced by a grammar, and the request "
          "also asks for structured output; give one of them",
          "tool_choice", "invalid_value");
    }
    out->grammar = std::move(g);
  }
  return std::nullopt;
}

}  // namespace duet::http
