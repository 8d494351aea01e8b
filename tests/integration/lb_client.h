// What a client of a load-balanced duet HTTP API does in the integration tests: a JSON POST
// (cpp-httplib), a streamed POST read as raw bytes with each server-sent event's arrival time,
// and a server's own request counters read from its /metrics. Shared by haproxy_test.cc and
// coordinator_pool_test.cc.
//
//   auto [status, body] = PostJson(port, "/v1/completions", {{"prompt", "Hi"}});
//   Stream s = PostStream(port, "/v1/completions", body.dump());   // s.done: "data: [DONE]"
//   double served = HttpRequests(port, "/v1/completions", 200);
#pragma once

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace duet::testing {

// POST `body` to `path` on 127.0.0.1:`port`: the status (0 when there was no response: the
// body then says why) and the body.
std::pair<int, std::string> PostJson(int port, const std::string& path, const nlohmann::json& body,
                                     absl::Duration timeout = absl::Seconds(60));

// What a raw client saw of a streamed response: the bytes, and when each SSE event ("data: ")
// arrived, counted from the request's write.
struct Stream {
  std::string all;
  std::vector<absl::Duration> event_times;
  bool done = false;  // "data: [DONE]" arrived
};

// Sends `body` as a streamed POST to `path` on `port` and reads (at most `timeout`) until the
// server closes the connection. `first_event`, when given, is set once the first event arrived.
Stream PostStream(int port, const std::string& path, const std::string& body,
                  absl::Duration timeout = absl::Seconds(60),
                  std::atomic<bool>* first_event = nullptr);

// GET /metrics of the duet HTTP front on `port`; "" when the scrape fails.
std::string ScrapeMetrics(int port);
// duet_http_requests_total of that front for `path` answered with `code` (summed over its other
// labels); -1 when the scrape fails.
double HttpRequests(int port, const std::string& path, int code);

}  // namespace duet::testing
