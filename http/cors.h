// CORS for the OpenAI-compatible front, as vLLM's server answers browsers (its
// --allowed-origins / --allowed-methods / --allowed-headers / --allow-credentials, each "*" by
// default but credentials): a request that carries an Origin gets Access-Control-Allow-Origin
// when the origin is allowed, and a preflight (OPTIONS with Origin and
// Access-Control-Request-Method) is answered here, before any API key is asked for: 200 with
// what may be sent, or 400 naming the disallowed origin, method or header.
//
//   CorsOptions cors;                                   // every origin, method and header
//   HttpHeaders extra = CorsHeaders(cors, request);     // added to the response
//   if (IsPreflight(request)) { Preflight p = AnswerPreflight(cors, request); ... }
#pragma once

#include <string>
#include <vector>

#include "http/http_server.h"

namespace duet::http {

struct CorsOptions {
  std::vector<std::string> allowed_origins = {"*"};  // "*": any origin
  std::vector<std::string> allowed_methods = {"*"};  // "*": any method
  std::vector<std::string> allowed_headers = {"*"};  // "*": any header
  // Cookies and Authorization from a browser: the origin is then echoed, never "*".
  bool allow_credentials = false;
};

// The CORS headers of an actual (not preflight) response: none without an Origin header or for
// an origin not allowed (the browser then withholds the response from the page).
HttpHeaders CorsHeaders(const CorsOptions& options, const HttpRequest& request);

// OPTIONS with an Origin and an Access-Control-Request-Method header.
bool IsPreflight(const HttpRequest& request);

struct Preflight {
  int status = 200;
  HttpHeaders headers;
  std::string body;  // plain text: why a refused preflight was refused
};
Preflight AnswerPreflight(const CorsOptions& options, const HttpRequest& request);

}  // namespace duet::http
