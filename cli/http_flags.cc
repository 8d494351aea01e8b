#include "cli/http_flags.h"

#include <algorithm>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "cli/flag_groups.h"
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
            &absl::GetFlagReflectionHandle(FLAGS_allow_credentials)}},
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

}  // namespace duet::cli
