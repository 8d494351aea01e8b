#include "http/cors.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace duet::http {
namespace {

// What a wildcard of allowed_methods stands for (Starlette's list, as vLLM answers).
constexpr const char* kAllMethods = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT";

bool Wildcard(const std::vector<std::string>& v) {
  return std::find(v.begin(), v.end(), "*") != v.end();
}

bool OriginAllowed(const CorsOptions& o, const std::string& origin) {
  return Wildcard(o.allowed_origins) ||
         std::find(o.allowed_origins.begin(), o.allowed_origins.end(), origin) !=
             o.allowed_origins.end();
}

bool Contains(const std::vector<std::string>& v, absl::string_view item, bool ignore_case) {
  for (const std::string& x : v) {
    if (ignore_case ? absl::EqualsIgnoreCase(x, item) : x == item) return true;
  }
  return false;
}

// The Access-Control-Allow-Origin (and -Credentials, Vary) headers for an allowed origin.
void AllowOrigin(const CorsOptions& o, const std::string& origin, HttpHeaders* out) {
  if (Wildcard(o.allowed_origins) && !o.allow_credentials) {
    out->emplace_back("Access-Control-Allow-Origin", "*");
    return;
  }
  out->emplace_back("Access-Control-Allow-Origin", origin);
  out->emplace_back("Vary", "Origin");
  if (o.allow_credentials) out->emplace_back("Access-Control-Allow-Credentials", "true");
}

}  // namespace

HttpHeaders CorsHeaders(const CorsOptions& options, const HttpRequest& request) {
  HttpHeaders out;
  const std::string origin = request.Header("Origin");
  if (origin.empty() || !OriginAllowed(options, origin)) return out;
  AllowOrigin(options, origin, &out);
  return out;
}

bool IsPreflight(const HttpRequest& request) {
  return request.method == "OPTIONS" && !request.Header("Origin").empty() &&
         !request.Header("Access-Control-Request-Method").empty();
}

Preflight AnswerPreflight(const CorsOptions& options, const HttpRequest& request) {
  const std::string origin = request.Header("Origin");
  const std::string method = request.Header("Access-Control-Request-Method");
  const std::string asked = request.Header("Access-Control-Request-Headers");
  std::vector<std::string> refused;
  if (!OriginAllowed(options, origin)) refused.push_back(absl::StrCat("origin '", origin, "'"));
  if (!Wildcard(options.allowed_methods) &&
      !Contains(options.allowed_methods, method, /*ignore_case=*/false)) {
    refused.push_back(absl::StrCat("method '", method, "'"));
  }
  if (!Wildcard(options.allowed_headers)) {
    for (absl::string_view h : absl::StrSplit(asked, ',', absl::SkipWhitespace())) {
      h = absl::StripAsciiWhitespace(h);
      if (!Contains(options.allowed_headers, h, /*ignore_case=*/true)) {
        refused.push_back(absl::StrCat("header '", h, "'"));
      }
    }
  }
  Preflight p;
  if (!refused.empty()) {
    p.status = 400;
    p.body = absl::StrCat("Disallowed CORS ", absl::StrJoin(refused, ", "));
    return p;
  }
  AllowOrigin(options, origin, &p.headers);
  p.headers.emplace_back("Access-Control-Allow-Methods",
                         Wildcard(options.allowed_methods)
                             ? std::string(kAllMethods)
                             : absl::StrJoin(options.allowed_methods, ", "));
  // A wildcard echoes what was asked for (a literal "*" does not cover Authorization).
  const std::string headers =
      Wildcard(options.allowed_headers) ? asked : absl::StrJoin(options.allowed_headers, ", ");
  if (!headers.empty()) p.headers.emplace_back("Access-Control-Allow-Headers", headers);
  p.headers.emplace_back("Access-Control-Max-Age", "600");
  p.body = "OK";
  return p;
}

}  // namespace duet::http
