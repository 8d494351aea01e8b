#include "http/structured_output.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "http/request_errors.h"

namespace duet::http {
namespace {

using nlohmann::json;

// A value refused: invalid_value unless said otherwise.
ApiError Refused(std::string message, std::string param, std::string code = "invalid_value") {
  return Invalid(std::move(message), std::move(param), std::move(code));
}

bool Set(const json& v) { return !v.is_null(); }

// A JSON schema given as an object (or boolean), or as a string holding one.
std::optional<ApiError> SchemaText(const std::string& field, const json& v, std::string* out) {
  if (v.is_object() || v.is_boolean()) {
    *out = v.dump();
    return std::nullopt;
  }
  if (!v.is_string()) return WrongType(field, "a JSON schema (an object, or a string)", v);
  const json parsed = json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean())) {
    return Refused(absl::StrCat("'", field,
                                "' is not a JSON schema: its text is not a JSON "
                                "object"),
                   field);
  }
  *out = parsed.dump();
  return std::nullopt;
}

std::optional<ApiError> Text(const std::string& field, const json& v, std::string* out) {
  if (!v.is_string()) return WrongType(field, "a string", v);
  *out = v.get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> Choices(const std::string& field, const json& v,
                                std::vector<std::string>* out) {
  if (!v.is_array()) return WrongType(field, "an array of strings", v);
  for (const json& c : v) {
    if (!c.is_string()) return WrongType(field + "[]", "a string", c);
    out->push_back(c.get<std::string>());
  }
  return std::nullopt;
}

// response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {...}}.
std::optional<ApiError> FromResponseFormat(const json& v,
                                           std::optional<grammar::GrammarSpec>* out) {
  if (!v.is_object()) return WrongType("response_format", "an object", v);
  const auto type = v.find("type");
  if (type == v.end() || !type->is_string()) {
    return Refused("'response_format.type' must be one of text, json_object, json_schema",
                   "response_format");
  }
  const std::string& t = type->get_ref<const std::string&>();
  for (const auto& [key, value] : v.items()) {
    if (key != "type" && !(key == "json_schema" && t == "json_schema") && !value.is_null()) {
      return Refused(absl::StrCat("'response_format.", key, "' does not apply to type '", t, "'"),
                     "response_format");
    }
  }
  if (t == "text") return std::nullopt;
  if (t == "json_object") {
    *out = grammar::GrammarSpec::JsonObject();
    return std::nullopt;
  }
  if (t != "json_schema") {
    return Refused(absl::StrCat("'response_format.type' '", t,
                                "' is not supported (text, json_object, json_schema)"),
                   "response_format", "unsupported");
  }
  const auto js = v.find("json_schema");
  if (js == v.end() || !js->is_object()) {
    return Refused("'response_format.json_schema' must be an object with a 'schema'",
                   "response_format");
  }
  bool strict = true;  // as vLLM, whose schemas compile in xgrammar's strict mode
  std::string schema;
  for (const auto& [key, value] : js->items()) {
    if (value.is_null() || key == "name" || key == "description") continue;
    if (key == "strict") {
      if (!value.is_boolean())
        return WrongType("response_format.json_schema.strict", "a boolean", value);
      strict = value.get<bool>();
    } else if (key == "schema") {
      if (auto e = SchemaText("response_format.json_schema.schema", value, &schema)) return e;
    } else {
      return Refused(absl::StrCat("'response_format.json_schema.", key, "' is not supported"),
                     "response_format", "unsupported");
    }
  }
  if (schema.empty()) {
    return Refused("'response_format.json_schema' has no 'schema'", "response_format");
  }
  *out = grammar::GrammarSpec::JsonSchema(std::move(schema), strict);
  return std::nullopt;
}

// vLLM's structured_outputs: exactly one of json, regex, choice, grammar, json_object.
std::optional<ApiError> FromStructuredOutputs(const json& v,
                                              std::optional<grammar::GrammarSpec>* out) {
  if (!v.is_object()) return WrongType("structured_outputs", "an object", v);
  std::vector<std::string> given;
  for (const auto& [key, value] : v.items()) {
    const std::string field = "structured_outputs." + key;
    if (value.is_null()) continue;
    if (key == "json") {
      std::string schema;
      if (auto e = SchemaText(field, value, &schema)) return e;
      *out = grammar::GrammarSpec::JsonSchema(std::move(schema));
    } else if (key == "regex") {
      std::string text;
      if (auto e = Text(field, value, &text)) return e;
      *out = grammar::GrammarSpec::Regex(std::move(text));
    } else if (key == "choice") {
      std::vector<std::string> choices;
      if (auto e = Choices(field, value, &choices)) return e;
      *out = grammar::GrammarSpec::Choice(std::move(choices));
    } else if (key == "grammar") {
      std::string text;
      if (auto e = Text(field, value, &text)) return e;
      *out = grammar::GrammarSpec::Ebnf(std::move(text));
    } else if (key == "json_object") {
      if (!value.is_boolean()) return WrongType(field, "a boolean", value);
      if (!value.get<bool>()) continue;
      *out = grammar::GrammarSpec::JsonObject();
    } else if ((key == "disable_fallback" || key == "disable_any_whitespace" ||
                key == "disable_additional_properties") &&
               value.is_boolean() && !value.get<bool>()) {
      continue;  // the defaults, which are what duet does
    } else {
      return Refused(absl::StrCat("'", field, "' is not supported"), "structured_outputs",
                     "unsupported");
    }
    given.push_back(key);
  }
  if (given.size() > 1) {
    return Refused(absl::StrCat("'structured_outputs' sets ", absl::StrJoin(given, ", "),
                                "; give exactly one"),
                   "structured_outputs");
  }
  if (given.empty()) {
    return Refused("'structured_outputs' sets none of json, regex, choice, grammar, json_object",
                   "structured_outputs");
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseStructuredOutput(const json& body,
                                              std::optional<grammar::GrammarSpec>* out) {
  out->reset();
  for (const char* unsupported :
       {"guided_decoding_backend", "guided_whitespace_pattern", "structural_tag"}) {
    if (auto it = body.find(unsupported); it != body.end() && Set(*it)) {
      return Refused(absl::StrCat("'", unsupported, "' is not supported"), unsupported,
                     "unsupported");
    }
  }
  // Every source that asks for a grammar, in the order vLLM gives them.
  std::vector<std::string> sources;
  std::optional<grammar::GrammarSpec> spec;
  auto take = [&](const char* field, std::optional<grammar::GrammarSpec> one) {
    if (!one.has_value()) return;
    sources.push_back(field);
    spec = std::move(one);
  };
  auto field = [&](const char* name) -> const json* {
    auto it = body.find(name);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* v = field("response_format")) {
    std::optional<grammar::GrammarSpec> one;
    if (auto e = FromResponseFormat(*v, &one)) return e;
    take("response_format", std::move(one));
  }
  if (const json* v = field("structured_outputs")) {
    std::optional<grammar::GrammarSpec> one;
    if (auto e = FromStructuredOutputs(*v, &one)) return e;
    take("structured_outputs", std::move(one));
  }
  if (const json* v = field("guided_json")) {
    std::string schema;
    if (auto e = SchemaText("guided_json", *v, &schema)) return e;
    take("guided_json", grammar::GrammarSpec::JsonSchema(std::move(schema)));
  }
  if (const json* v = field("guided_regex")) {
    std::string text;
    if (auto e = Text("guided_regex", *v, &text)) return e;
    take("guided_regex", grammar::GrammarSpec::Regex(std::move(text)));
  }
  if (const json* v = field("guided_choice")) {
    std::vector<std::string> choices;
    if (auto e = Choices("guided_choice", *v, &choices)) return e;
    if (!choices.empty()) take("guided_choice", grammar::GrammarSpec::Choice(std::move(choices)));
  }
  if (const json* v = field("guided_grammar")) {
    std::string text;
    if (auto e = Text("guided_grammar", *v, &text)) return e;
    take("guided_grammar", grammar::GrammarSpec::Ebnf(std::move(text)));
  }
  if (sources.size() > 1) {
    return Refused(absl::StrCat("structured output is asked for by ", absl::StrJoin(sources, ", "),
                                "; give one"),
                   sources[1]);
  }
  if (!spec.has_value()) return std::nullopt;
  if (absl::Status s = grammar::ValidateGrammarSpec(*spec); !s.ok()) {
    return Refused(std::string(s.message()), sources[0]);
  }
  *out = std::move(spec);
  return std::nullopt;
}

}  // namespace duet::http
