#include "cli/http_flags.h"

#include <algorithm>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/flag_groups.h"
#include "common/base/json_util.h"
#include "nlohmann/json.hpp"

namespace duet::cli {

// A flag whose value is a JSON list of strings, as vLLM takes --allowed-origins '["https://a"]'.
struct JsonStringList {
  std::vector<std::string> items;
};

bool AbslParseFlag(absl::string_view text, JsonStringList* out, std::string* error) {
  const nlohmann::json j =
      nlohmann::json::parse(std::string(text), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) {
    *error = "not a JSON list of strings (e.g. '[\"*\"]' or '[\"https://a.example\"]')";
    return false;
  }
  out->items.clear();
  for (const nlohmann::json& item : j) {
    if (!item.is_string() || item.get_ref<const std::string&>().empty()) {
      *error = "every entry must be a non-empty string, got " + item.dump();
      return false;
    }
    out->items.push_back(item.get<std::string>());
  }
  return true;
}

std::string AbslUnparseFlag(const JsonStringList& list) {
  return nlohmann::json(list.items).dump();
}

}  // namespace duet::cli

ABSL_FLAG(int, http_port, -1,
          "port of the OpenAI-compatible HTTP API and /metrics (-1: off, 0: any free port)");
ABSL_FLAG(std::string, http_host, "127.0.0.1", "address the HTTP API binds");
ABSL_FLAG(std::string, served_model_name, "",
          "comma-separated names the HTTP API serves the model under (the first is reported; a "
          "request for another model is a 404). Empty: the model path's last component");
ABSL_FLAG(int64_t, max_body_bytes, 1 << 20, "largest HTTP request body accepted");
ABSL_FLAG(int, max_concurrent_streams, 64,
          "HTTP generation requests in flight; more get 429 with Retry-After");
ABSL_FLAG(int, http_max_connections, duet::http::HttpFrontOptions{}.max_connections,
          "open HTTP connections, idle or not; more get 503 (mind the process's file-descriptor "
          "limit)");
ABSL_FLAG(double, http_header_timeout_s,
          absl::ToDoubleSeconds(duet::http::HttpFrontOptions{}.header_timeout),
          "seconds a client has to send a request's header; then 408 and close");
ABSL_FLAG(double, http_body_timeout_s,
          absl::ToDoubleSeconds(duet::http::HttpFrontOptions{}.body_timeout),
          "seconds after the header to send the body; then 408");
ABSL_FLAG(double, http_idle_timeout_s,
          absl::ToDoubleSeconds(duet::http::HttpFrontOptions{}.idle_timeout),
          "seconds a kept-alive HTTP connection may idle between requests");
ABSL_FLAG(double, http_write_timeout_s,
          absl::ToDoubleSeconds(duet::http::HttpFrontOptions{}.write_timeout),
          "seconds a response may wait for a client that reads none of it (a full send "
          "buffer); then the connection is closed and its request cancelled, as for a "
          "disconnect. Must be positive");

ABSL_FLAG(duet::cli::JsonStringList, allowed_origins, {{"*"}},
          "CORS: origins whose pages may call the HTTP API, a JSON list (vLLM's form); [\"*\"]: "
          "any");
ABSL_FLAG(duet::cli::JsonStringList, allowed_methods, {{"*"}},
          "CORS: methods a cross-origin page may use, a JSON list; [\"*\"]: any");
ABSL_FLAG(duet::cli::JsonStringList, allowed_headers, {{"*"}},
          "CORS: request headers a cross-origin page may send, a JSON list; [\"*\"]: any");
ABSL_FLAG(bool, allow_credentials, false,
          "CORS: let cross-origin pages send credentials (the origin is then echoed, never *)");

ABSL_FLAG(std::string, chat_template, "",
          "a file holding the chat template to use instead of the model's (vLLM's "
          "--chat-template), e.g. one that renders tools; like the model's, it is recognised by "
          "its family (ChatML, Llama-3, ...) and rendered as that family's template does");
ABSL_FLAG(bool, enable_auto_tool_choice, false,
          "serve tool_choice auto (the default when a request gives tools): the model decides "
          "whether to call a tool, and --tool_call_parser reads its calls");
ABSL_FLAG(std::string, tool_call_parser, "",
          "how the model writes tool calls, for tool_choice auto: hermes (<tool_call> JSON, as "
          "Qwen2.5 and Qwen3) or llama3_json");

ABSL_FLAG(std::string, api_key, "",
          "the HTTP API's key: a server requires 'Authorization: Bearer KEY' on every route but "
          "/health, /ping, /metrics, /metrics/targets and /version; bench serve sends it");

namespace duet::cli {

std::vector<FlagGroupInfo> HttpFlagGroups() {
  return {{FlagGroup::kHttp,
           "http",
           "OpenAI-compatible HTTP API",
           {&absl::GetFlagReflectionHandle(FLAGS_http_port),
            &absl::GetFlagReflectionHandle(FLAGS_http_host),
            &absl::GetFlagReflectionHandle(FLAGS_served_model_name),
            &absl::GetFlagReflectionHandle(FLAGS_max_body_bytes),
            &absl::GetFlagReflectionHandle(FLAGS_max_concurrent_streams),
            &absl::GetFlagReflectionHandle(FLAGS_http_max_connections),
            &absl::GetFlagReflectionHandle(FLAGS_http_header_timeout_s),
            &absl::GetFlagReflectionHandle(FLAGS_http_body_timeout_s),
            &absl::GetFlagReflectionHandle(FLAGS_http_idle_timeout_s),
            &absl::GetFlagReflectionHandle(FLAGS_http_write_timeout_s),
            &absl::GetFlagReflectionHandle(FLAGS_allowed_origins),
            &absl::GetFlagReflectionHandle(FLAGS_allowed_methods),
            &absl::GetFlagReflectionHandle(FLAGS_allowed_headers),
            &absl::GetFlagReflectionHandle(FLAGS_allow_credentials),
            &absl::GetFlagReflectionHandle(FLAGS_chat_template),
            &absl::GetFlagReflectionHandle(FLAGS_enable_auto_tool_choice),
            &absl::GetFlagReflectionHandle(FLAGS_tool_call_parser)}},
          {FlagGroup::kApiKey,
           "api_key",
           "HTTP API key",
           {&absl::GetFlagReflectionHandle(FLAGS_api_key)}}};
}

std::string ReadApiKeyFlag() { return absl::GetFlag(FLAGS_api_key); }

std::optional<http::HttpFrontOptions> HttpFrontOptionsFromFlags() {
  if (absl::GetFlag(FLAGS_http_port) < 0) return std::nullopt;
  std::vector<std::string> names;
  for (absl::string_view n :
       absl::StrSplit(absl::GetFlag(FLAGS_served_model_name), ',', absl::SkipWhitespace())) {
    names.emplace_back(absl::StripAsciiWhitespace(n));
  }
  return http::HttpFrontOptions{
      .host = absl::GetFlag(FLAGS_http_host),
      .port = absl::GetFlag(FLAGS_http_port),
      .api_key = ReadApiKeyFlag(),
      // Below 1 is refused by HttpFront::Start, naming the flag (negative as 0).
      .max_body_bytes =
          static_cast<size_t>(std::max<int64_t>(0, absl::GetFlag(FLAGS_max_body_bytes))),
      .max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams),
      .max_connections = absl::GetFlag(FLAGS_http_max_connections),
      .header_timeout = absl::Seconds(absl::GetFlag(FLAGS_http_header_timeout_s)),
      .body_timeout = absl::Seconds(absl::GetFlag(FLAGS_http_body_timeout_s)),
      .idle_timeout = absl::Seconds(absl::GetFlag(FLAGS_http_idle_timeout_s)),
      .write_timeout = absl::Seconds(absl::GetFlag(FLAGS_http_write_timeout_s)),
      .served_model_names = names,
      .cors = {.allowed_origins = absl::GetFlag(FLAGS_allowed_origins).items,
               .allowed_methods = absl::GetFlag(FLAGS_allowed_methods).items,
               .allowed_headers = absl::GetFlag(FLAGS_allowed_headers).items,
               .allow_credentials = absl::GetFlag(FLAGS_allow_credentials)}};
}

absl::Status AddChatFromFlags(std::optional<http::HttpFrontOptions>& http) {
  const std::string template_path = absl::GetFlag(FLAGS_chat_template);
  const std::string parser = absl::GetFlag(FLAGS_tool_call_parser);
  const bool auto_tools = absl::GetFlag(FLAGS_enable_auto_tool_choice);
  if (!http) {
    if (!template_path.empty() || !parser.empty() || auto_tools) {
      return absl::InvalidArgumentError(
          "--chat_template, --enable_auto_tool_choice and --tool_call_parser apply to the HTTP "
          "API, which --http_port turns on");
    }
    return absl::OkStatus();
  }
  if (!template_path.empty()) {
    absl::StatusOr<std::string> text = model::ReadFileToString(template_path);
    if (!text.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--chat_template: ", text.status().message()));
    }
    if (text->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--chat_template: ", template_path, " is empty"));
    }
    http->chat_template = *std::move(text);
  }
  if (!parser.empty()) {
    absl::StatusOr<http::ToolCallParser> p = http::ParseToolCallParser(parser);
    if (!p.ok())
      return absl::InvalidArgumentError(absl::StrCat("--tool_call_parser: ", p.status().message()));
    http->tool_call_parser = *p;
  }
  if (auto_tools && parser.empty()) {
    return absl::InvalidArgumentError(
        "--enable_auto_tool_choice needs --tool_call_parser (hermes or llama3_json)");
  }
  http->enable_auto_tool_choice = auto_tools;
  return absl::OkStatus();
}

}  // namespace duet::cli
