// HttpFront's routes besides generation and what every response carries: the API key (which
// routes it guards, the body limit), /health and /ping following readiness, GET
// /metrics/targets, CORS preflights and headers, and X-Request-Id.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "tests/integration/http_front_rig.h"

namespace duet::http {
namespace {

// A header of `r` (case-insensitive name), "" when absent.
std::string HeaderOf(const Reply& r, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(r.head, "\r\n")) {
    const size_t colon = line.find(':');
    if (colon != absl::string_view::npos && absl::EqualsIgnoreCase(line.substr(0, colon), name)) {
      return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
  }
  return "";
}

TEST_F(HttpFrontTest, BearerTokenAndBodyLimit) {
  StartFront({.api_key = "sekret", .max_body_bytes = 1000});
  Reply r = Post("/v1/completions", {{"prompt", "Hi"}});
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(Error(r)["type"], "authentication_error");
  r = Post("/v1/completions", {{"prompt", "Hi"}}, "Authorization: Bearer wrong\r\n");
  EXPECT_EQ(r.status, 401);
  r = Post("/v1/completions", {{"prompt", "Hi"}}, "Authorization: Bearer sekret\r\n");
  EXPECT_EQ(r.status, 200) << r.body;
  r = Post("/v1/completions", {{"prompt", std::string(5000, 'a')}},
           "Authorization: Bearer sekret\r\n");
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(Error(r)["code"], "body_too_large");
  // Health and metrics stay open for load balancers and scrapers.
  EXPECT_EQ(Exchange(front_->port(), "GET", "/health", "").status, 200);
  EXPECT_EQ(Exchange(front_->port(), "GET", "/metrics", "").status, 200);
}

TEST_F(HttpFrontTest, MetricsTargetsListThisServerAtItsHostAndTheNodesThatServeMetrics) {
  StartFront({.server_kind = "colocated"});
  Reply r = Exchange(front_->port(), "GET", "/metrics/targets", "");  // sends "Host: x"
  ASSERT_EQ(r.status, 200) << r.head << r.body;
  EXPECT_NE(r.head.find("application/json"), std::string::npos) << r.head;
  const json want = json::parse(R"([
    {"targets": ["x"], "labels": {"node_kind": "colocated", "node_role": "colocated server"}},
    {"targets": ["10.0.0.4:9100"],
     "labels": {"node_id": "decode-0", "node_kind": "decode", "node_role": "decode node",
                "node_epoch": "5"}}])");
  EXPECT_EQ(json::parse(r.body), want) << r.body;
}

TEST_F(HttpFrontTest, MetricsTargetsWithoutAHostHeaderIsRefused) {
  StartFront();
  // HTTP/1.0 allows a request without Host; this server's own target would be unknown.
  Reply r = testing::ExchangeRaw(front_->port(), "GET /metrics/targets HTTP/1.0\r\n\r\n");
  EXPECT_EQ(r.status, 400) << r.head << r.body;
  EXPECT_EQ(Error(r)["code"], "missing_host") << r.body;
}

// As vLLM serves browsers: every origin by default (a preflight answered before any key is
// asked for), an origin list that refuses the others, and credentials echoing the origin.

TEST_F(HttpFrontTest, CorsPreflightsAndHeaders) {
  StartFront({.api_key = "sekret"});
  const std::string preflight =
      "Origin: https://app.example\r\nAccess-Control-Request-Method: POST\r\n"
      "Access-Control-Request-Headers: authorization, content-type\r\n";
  Reply r = Exchange(front_->port(), "OPTIONS", "/v1/chat/completions", "", preflight);
  EXPECT_EQ(r.status, 200) << r.head;
  EXPECT_EQ(HeaderOf(r, "Access-Control-Allow-Origin"), "*");
  EXPECT_TRUE(absl::StrContains(HeaderOf(r, "Access-Control-Allow-Methods"), "POST"));
  EXPECT_EQ(HeaderOf(r, "Access-Control-Allow-Headers"), "authorization, content-type");
  // The request itself carries the origin header back.
  r = Post("/v1/completions", {{"prompt", "Hi"}},
           "Origin: https://app.example\r\nAuthorization: Bearer sekret\r\n");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(HeaderOf(r, "Access-Control-Allow-Origin"), "*");
  // No Origin: no CORS headers.
  r = Post("/v1/completions", {{"prompt", "Hi"}}, "Authorization: Bearer sekret\r\n");
  EXPECT_EQ(HeaderOf(r, "Access-Control-Allow-Origin"), "");

  front_.reset();
  StartFront({.cors = {.allowed_origins = {"https://ok.example"},
                       .allowed_methods = {"GET", "POST"},
                       .allowed_headers = {"Content-Type"},
                       .allow_credentials = true}});
  r = Exchange(front_->port(), "OPTIONS", "/v1/completions", "",
               "Origin: https://evil.example\r\nAccess-Control-Request-Method: POST\r\n");
  EXPECT_EQ(r.status, 400);
  EXPECT_TRUE(absl::StrContains(r.body, "origin 'https://evil.example'")) << r.body;
  EXPECT_EQ(HeaderOf(r, "Access-Control-Allow-Origin"), "");
  r = Exchange(front_->port(), "OPTIONS", "/v1/completions", "",
               "Origin: https://ok.example\r\nAccess-Control-Request-Method: PUT\r\n"
               "Access-Control-Request-Headers: X-Secret\r\n");
  EXPECT_EQ(r.status, 400);
  EXPECT_TRUE(absl::StrContains(r.body, "method 'PUT'")) << r.body;
  EXPECT_TRUE(absl::StrContains(r.body, "header 'X-Secret'")) << r.body;
  r = Exchange(front_->port(), "OPTIONS", "/v1/completions", "",
               "Origin: https://ok.example\r\nAccess-Control-Request-Method: POST\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(HeaderOf(r, "Access-Control-Allow-Origin"), "https://ok.example");
  EXPECT_EQ(HeaderOf(r, "Access-Control-Allow-Credentials"), "true");
  r = Post("/v1/completions", {{"prompt", "Hi"}}, "Origin: https://evil.example\r\n");
  EXPECT_EQ(HeaderOf(r, "Access-Control-Allow-Origin"), "");
  r = Post("/v1/completions", {{"prompt", "Hi"}}, "Origin: https://ok.example\r\n");
  EXPECT_EQ(HeaderOf(r, "Access-Control-Allow-Origin"), "https://ok.example");
}

// /ping answers as /health does (no body); X-Request-Id comes back on every kind of response;
// with a key, only the load balancers' and scrapers' routes stay open.

TEST_F(HttpFrontTest, PingRequestIdAndTheRoutesAKeyGuards) {
  StartFront({.api_key = "sekret"});
  for (const char* method : {"GET", "POST"}) {
    Reply r = Exchange(front_->port(), method, "/ping", "");
    EXPECT_EQ(r.status, 200) << method;
    EXPECT_EQ(r.body, "");
  }
  backend_.ready = false;
  EXPECT_EQ(Exchange(front_->port(), "GET", "/ping", "").status, 503);
  backend_.ready = true;

  const std::string auth = "Authorization: Bearer sekret\r\n";
  Reply r = Post("/v1/completions", {{"prompt", "Hi"}}, auth + "X-Request-Id: abc-123\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(HeaderOf(r, "X-Request-Id"), "abc-123");
  r = Post("/v1/completions", {{"prompt", "Hi"}, {"stream", true}},
           auth + "X-Request-Id: streamed-7\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(HeaderOf(r, "X-Request-Id"), "streamed-7");
  r = Post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 0}},
           auth + "X-Request-Id: refused-1\r\n");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(HeaderOf(r, "X-Request-Id"), "refused-1");
  // Without one, the server's own id (the response's).
  EXPECT_TRUE(absl::StartsWith(
      HeaderOf(Post("/v1/completions", {{"prompt", "Hi"}, {"stream", true}}, auth), "X-Request-Id"),
      "cmpl-"));

  for (const char* open : {"/health", "/ping", "/metrics", "/version"}) {
    EXPECT_EQ(Exchange(front_->port(), "GET", open, "").status, 200) << open;
  }
  EXPECT_EQ(Exchange(front_->port(), "GET", "/metrics/targets", "").status, 200);
  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/v1/models"}, {"POST", "/tokenize"}, {"POST", "/detokenize"}}) {
    Reply refused = Exchange(front_->port(), method, path, R"({"prompt": "x"})");
    EXPECT_EQ(refused.status, 401) << path;
  }
  EXPECT_EQ(Exchange(front_->port(), "POST", "/tokenize", R"({"prompt": "x"})", auth).status, 200);
}

// As vLLM: control tokens are left out of the text unless skip_special_tokens is false; the stop
// token that ended the output (EOS here) and a matched stop string stay out unless
// include_stop_str_in_output.

TEST_F(HttpFrontTest, HealthFollowsReadiness) {
  StartFront();
  backend_.ready = false;
  Reply r = Exchange(front_->port(), "GET", "/health", "");
  EXPECT_EQ(r.status, 503);
  backend_.ready = true;
  EXPECT_EQ(Exchange(front_->port(), "GET", "/health", "").status, 200);
}

}  // namespace
}  // namespace duet::http
