// A raw HTTP/1.1 exchange with a server on 127.0.0.1 (Connection: close), for the integration
// tests of the OpenAI-compatible HTTP front: what a client sees, bytes and all (status line,
// headers, a de-chunked body), without an HTTP client library in between.
//
//   Reply r = Exchange(port, "POST", "/v1/completions", R"({"prompt": "Hi"})");
//   EXPECT_EQ(r.status, 200) << r.head;
#pragma once

#include <string>

namespace duet::testing {

struct Reply {
  int status = 0;  // 0: no connection or no response
  std::string head;
  std::string body;  // de-chunked
};

// Reads until the server closes the connection.
Reply Exchange(int port, const std::string& method, const std::string& path,
               const std::string& body, const std::string& extra_headers = "");
// Sends `request` as it is (request line, headers and body) and reads until the server closes
// the connection.
Reply ExchangeRaw(int port, const std::string& request);

}  // namespace duet::testing
