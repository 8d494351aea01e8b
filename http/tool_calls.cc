#include "http/tool_calls.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/json_util.h"
#include "http/request_errors.h"

namespace duet::http {
namespace {

using model::PythonJsonDumps;
using nlohmann::json;
using nlohmann::ordered_json;

constexpr char kCallOpen[] = "<tool_call>";
constexpr char kCallClose[] = "</tool_call>";
constexpr char kPythonTag[] = "<|python_tag|>";

// The length of the longest suffix of `s` that is a proper prefix of `token` (text that may
// still become the token).
size_t PartialSuffix(const std::string& s, absl::string_view token) {
  for (size_t n = std::min(s.size(), token.size() - 1); n > 0; --n) {
    if (absl::string_view(s).substr(s.size() - n) == token.substr(0, n)) return n;
  }
  return 0;
}

// The end of the JSON value starting at text[pos] (an object or array: brackets balanced outside
// strings), or npos when it does not end in the text.
size_t JsonValueEnd(const std::string& text, size_t pos) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = pos; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string::npos;
}

// {"name": string, <args_key>: object} (llama3_json also takes "arguments"): the call, or
// nullopt.
std::optional<std::pair<std::string, std::string>> CallOf(const ordered_json& j,
                                                          bool parameters_too) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return std::nullopt;
  auto args = j.find("arguments");
  if (args == j.end() && parameters_too) args = j.find("parameters");
  if (args == j.end() || !args->is_object()) return std::nullopt;
  return std::make_pair(name->get<std::string>(), PythonJsonDumps(*args));
}

// The value as the type the error helpers take.
json Plain(const ordered_json& v) { return json::parse(v.dump()); }

ordered_json ParseOrdered(absl::string_view text) {
  return ordered_json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

}  // namespace

absl::StatusOr<ToolCallParser> ParseToolCallParser(absl::string_view name) {
  if (name == "hermes") return ToolCallParser::kHermes;
  if (name == "llama3_json") return ToolCallParser::kLlama3Json;
  return absl::InvalidArgumentError(
      absl::StrCat("tool-call parser '", name, "' is not supported (hermes, llama3_json)"));
}

std::optional<ApiError> ParseTools(const ordered_json& body, ToolRequest* out) {
  *out = ToolRequest();
  auto tools = body.find("tools");
  if (tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return WrongType("tools", "an array of tools", Plain(*tools));
    for (size_t i = 0; i < tools->size(); ++i) {
      const ordered_json& t = (*tools)[i];
      const std::string field = absl::StrCat("tools[", i, "]");
      if (!t.is_object()) return WrongType(field, "an object", Plain(t));
      auto type = t.find("type");
      if (type == t.end() || !type->is_string() || type->get<std::string>() != "function") {
        return Invalid(absl::StrCat("'", field, ".type' must be \"function\""), field,
                       "invalid_value");
      }
      auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object()) {
        return Invalid(absl::StrCat("'", field, ".function' must be an object"), field,
                       "invalid_value");
      }
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
        return Invalid(absl::StrCat("'", field, ".function.name' must be a non-empty string"),
                       field, "invalid_value");
      }
      ordered_json params =
          ordered_json{{"type", "object"}, {"properties", ordered_json::object()}};
      if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null()) {
        if (!p->is_object()) {
          return Invalid(absl::StrCat("'", field,
                                      ".function.parameters' must be a JSON schema "
                                      "object"),
                         field, "invalid_value");
        }
        params = *p;
      }
      const std::string n = name->get<std::string>();
      if (std::find(out->names.begin(), out->names.end(), n) != out->names.end()) {
        return Invalid(absl::StrCat("tool '", n, "' is defined twice"), "tools", "invalid_value");
      }
      out->names.push_back(n);
      out->parameters.push_back(std::move(params));
      out->tools.push_back(t);
    }
  }
  const bool has_tools = !out->tools.empty();
  // As OpenAI and vLLM: auto when tools are given, none otherwise.
  out->choice = has_tools ? ToolChoice::kAuto : ToolChoice::kNone;
  auto choice = body.find("tool_choice");
  if (choice != body.end() && !choice->is_null()) {
    if (choice->is_string()) {
      const std::string& c = choice->get_ref<const std::string&>();
      if (c == "none") {
        out->choice = ToolChoice::kNone;
      } else if (c == "auto") {
        out->choice = ToolChoice::kAuto;
      } else if (c == "required") {
        out->choice = ToolChoice::kRequired;
      } else {
        return Invalid(absl::StrCat("'tool_choice' '", c,
                                    "' is not one of none, auto, required or a named function"),
                       "tool_choice", "invalid_value");
      }
    } else if (choice->is_object()) {
      auto fn = choice->find("function");
      auto type = choice->find("type");
      if (type == choice->end() || !type->is_string() || type->get<std::string>() != "function" ||
          fn == choice->end() || !fn->is_object() || !fn->contains("name") ||
          !(*fn)["name"].is_string()) {
        return Invalid(
            "'tool_choice' as an object must be {\"type\": \"function\", \"function\": "
            "{\"name\": ...}}",
            "tool_choice", "invalid_value");
      }
      out->choice = ToolChoice::kNamed;
      out->named = (*fn)["name"].get<std::string>();
      if (std::find(out->names.begin(), out->names.end(), out->named) == out->names.end()) {
        return Invalid(absl::StrCat("'tool_choice' names function '", out->named,
                                    "', which is not among 'tools'"),
                       "tool_choice", "invalid_value");
      }
    } else {
      return WrongType("tool_choice", "a string or an object", Plain(*choice));
    }
    if (!has_tools && out->choice != ToolChoice::kNone) {
      return Invalid("'tool_choice' other than none needs 'tools'", "tool_choice", "invalid_value");
    }
  }
  if (auto p = body.find("parallel_tool_calls"); p != body.end() && !p->is_null()) {
    if (!p->is_boolean()) return WrongType("parallel_tool_calls", "a boolean", Plain(*p));
    out->parallel = p->get<bool>();
  }
  return std::nullopt;
}

std::optional<grammar::GrammarSpec> ToolGrammar(const ToolRequest& r) {
  // Strict, as structured output's schemas are (and as vLLM compiles them with xgrammar):
  // properties a tool's parameters do not list are not generated.
  if (r.choice == ToolChoice::kNamed) {
    const size_t i = std::find(r.names.begin(), r.names.end(), r.named) - r.names.begin();
    return grammar::GrammarSpec::JsonSchema(r.parameters[i].dump(), /*strict=*/true);
  }
  if (r.choice != ToolChoice::kRequired) return std::nullopt;
  // As vLLM: an array of calls, each {"name": one tool's name, "parameters": its arguments}.
  ordered_json any_of = ordered_json::array();
  for (size_t i = 0; i < r.names.size(); ++i) {
    any_of.push_back({{"properties",
                       {{"name", {{"type", "string"}, {"enum", {r.names[i]}}}},
                        {"parameters", r.parameters[i]}}},
                      {"required", {"name", "parameters"}}});
  }
  ordered_json schema = {
      {"type", "array"}, {"minItems", 1}, {"items", {{"type", "object"}, {"anyOf", any_of}}}};
  if (!r.parallel) schema["maxItems"] = 1;
  return grammar::GrammarSpec::JsonSchema(schema.dump(), /*strict=*/true);
}

nlohmann::json ToolCallDeltasJson(const std::vector<ToolCallDelta>& deltas) {
  if (deltas.empty()) return json(nullptr);
  json out = json::array();
  for (const ToolCallDelta& d : deltas) {
    json fn = {{"arguments", d.arguments}};
    json call = {{"index", d.index}};
    if (!d.id.empty()) {
      call["id"] = d.id;
      call["type"] = "function";
      fn["name"] = d.name;
    }
    call["function"] = std::move(fn);
    out.push_back(std::move(call));
  }
  return out;
}

nlohmann::json ToolCallsJson(const std::vector<ToolCallOut>& calls) {
  json out = json::array();
  for (const ToolCallOut& c : calls) {
    out.push_back({{"id", c.id},
                   {"type", "function"},
                   {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return out;
}

ToolCallExtractor::ToolCallExtractor(const ToolRequest& request, ToolCallParser parser,
                                     std::string id_prefix)
    : named_(request.named), parallel_(request.parallel), id_prefix_(std::move(id_prefix)) {
  switch (request.choice) {
    case ToolChoice::kNone:
      mode_ = Mode::kContent;
      break;
    case ToolChoice::kNamed:
      mode_ = Mode::kNamed;
      break;
    case ToolChoice::kRequired:
      mode_ = Mode::kRequired;
      break;
    case ToolChoice::kAuto:
      mode_ = parser == ToolCallParser::kHermes       ? Mode::kHermes
              : parser == ToolCallParser::kLlama3Json ? Mode::kLlama3
                                                      : Mode::kContent;
      break;
  }
}

void ToolCallExtractor::Emit(ChatDelta* d, std::string content) {
  if (content.empty()) return;
  content_ += content;
  d->content += content;
}

void ToolCallExtractor::Call(ChatDelta* d, std::string name, std::string arguments) {
  if (!parallel_ && !calls_.empty()) return;  // parallel_tool_calls false: the first call only
  ToolCallOut c{.id = absl::StrCat(id_prefix_, "-", calls_.size()),
                .name = std::move(name),
                .arguments = std::move(arguments)};
  d->tool_calls.push_back({.index = static_cast<int>(calls_.size()),
                           .id = c.id,
                           .name = c.name,
                           .arguments = c.arguments});
  calls_.push_back(std::move(c));
}

ChatDelta ToolCallExtractor::Add(const std::string& text) {
  ChatDelta d;
  switch (mode_) {
    case Mode::kContent:
      Emit(&d, text);
      break;
    case Mode::kNamed:
      // The output is the arguments, streamed as they come.
      if (calls_.empty()) {
        Call(&d, named_, text);
      } else if (!text.empty()) {
        calls_[0].arguments += text;
        d.tool_calls.push_back({.index = 0, .arguments = text});
      }
      break;
    case Mode::kRequired:
      pending_ += text;  // a JSON array, parsed whole at the end
      break;
    case Mode::kHermes:
      pending_ += text;
      HermesScan(&d, /*final=*/false);
      break;
    case Mode::kLlama3:
      pending_ += text;
      if (!llama3_decided_) {
        // A call starts the output; anything else is content.
        if (pending_.empty() ||
            (pending_.size() < strlen(kPythonTag) && absl::StartsWith(kPythonTag, pending_))) {
          break;
        }
        llama3_decided_ = true;
        if (pending_[0] != '{' && !absl::StartsWith(pending_, kPythonTag)) {
          mode_ = Mode::kContent;
          Emit(&d, std::exchange(pending_, ""));
        }
      }
      break;
  }
  return d;
}

void ToolCallExtractor::HermesScan(ChatDelta* d, bool final) {
  while (true) {
    if (!in_call_) {
      const size_t at = pending_.find(kCallOpen);
      if (at == std::string::npos) {
        const size_t keep = final ? 0 : PartialSuffix(pending_, kCallOpen);
        std::string out = pending_.substr(0, pending_.size() - keep);
        if (called() && absl::StripAsciiWhitespace(out).empty()) {
          // Whitespace after a call is not content; it is held while a call may follow.
          if (final) pending_.clear();
          return;
        }
        pending_.erase(0, out.size());
        Emit(d, std::move(out));
        return;
      }
      std::string before = pending_.substr(0, at);
      if (!called() || !absl::StripAsciiWhitespace(before).empty()) Emit(d, std::move(before));
      pending_.erase(0, at + strlen(kCallOpen));
      in_call_ = true;
    }
    const size_t end = pending_.find(kCallClose);
    if (end == std::string::npos && !final) return;
    const std::string body = pending_.substr(0, end);
    if (auto call = CallOf(ParseOrdered(body), /*parameters_too=*/false)) {
      Call(d, std::move(call->first), std::move(call->second));
    } else {
      // Not a call after all: the block stays text.
      Emit(d, absl::StrCat(kCallOpen, body, end == std::string::npos ? "" : kCallClose));
    }
    pending_.erase(0, end == std::string::npos ? pending_.size() : end + strlen(kCallClose));
    in_call_ = false;
    if (final && pending_.empty()) return;
  }
}

bool ToolCallExtractor::ParseRequired(ChatDelta* d) {
  const ordered_json j = ParseOrdered(pending_);
  if (!j.is_array() || j.empty()) return false;
  std::vector<std::pair<std::string, std::string>> calls;
  for (const ordered_json& item : j) {
    if (!item.is_object()) return false;
    auto name = item.find("name");
    auto params = item.find("parameters");
    if (name == item.end() || !name->is_string() || params == item.end()) return false;
    calls.emplace_back(name->get<std::string>(), PythonJsonDumps(*params));
  }
  for (auto& [name, args] : calls) Call(d, std::move(name), std::move(args));
  return true;
}

bool ToolCallExtractor::ParseLlama3(ChatDelta* d) {
  std::string text = pending_;
  if (absl::StartsWith(text, kPythonTag)) text.erase(0, strlen(kPythonTag));
  std::vector<std::pair<std::string, std::string>> calls;
  size_t pos = 0;
  while (true) {
    while (pos < text.size() && (absl::ascii_isspace(text[pos]) || text[pos] == ';')) ++pos;
    if (pos == text.size()) break;
    if (text[pos] != '{') return false;
    const size_t end = JsonValueEnd(text, pos);
    if (end == std::string::npos) return false;
    auto call = CallOf(ParseOrdered(absl::string_view(text).substr(pos, end - pos)),
                       /*parameters_too=*/true);
    if (!call) return false;
    calls.push_back(*std::move(call));
    pos = end;
  }
  if (calls.empty()) return false;
  for (auto& [name, args] : calls) Call(d, std::move(name), std::move(args));
  return true;
}

std::string ToolCallExtractor::FinishReason(const std::string& engine_reason) const {
  if (!called() || mode_ == Mode::kNamed || engine_reason == "length") return engine_reason;
  return "tool_calls";
}

ChatDelta ToolCallExtractor::Finish() {
  ChatDelta d;
  switch (mode_) {
    case Mode::kContent:
      break;
    case Mode::kNamed:
      if (calls_.empty()) Call(&d, named_, "");
      break;
    case Mode::kRequired:
      // An array cut short (max_tokens) is no calls: the text stays content.
      if (!ParseRequired(&d)) Emit(&d, pending_);
      pending_.clear();
      break;
    case Mode::kHermes:
      HermesScan(&d, /*final=*/true);
      break;
    case Mode::kLlama3:
      if (!ParseLlama3(&d)) Emit(&d, pending_);
      pending_.clear();
      break;
  }
  return d;
}

}  // namespace duet::http
