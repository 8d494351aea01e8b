// What a client of a load-balanced duet HTTP API does in the integration tests (cpp-httplib,
// over HTTP or, with ClientTls, HTTPS with a client certificate): a JSON POST, a streamed POST
// with each server-sent event's arrival time, and a server's own request counters read from its
// /metrics. Shared by haproxy_test.cc and coordinator_pool_test.cc.
//
//   auto [status, body] = PostJson(port, "/v1/completions", {{"prompt", "Hi"}});
//   Stream s = PostStream(port, "/v1/completions", body.dump());   // s.done: "data: [DONE]"
//   double served = HttpRequests(port, "/v1/completions", 200);
//   ClientTls tls{.ca_file = ca, .cert_file = crt, .key_file = key};
//   auto [s2, b2] = PostJson(port, "/v1/completions", {{"prompt", "Hi"}}, &tls);
#pragma once

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace duet::testing {

// HTTPS for the client: the CA the server's certificate must chain to, and the client's own
// certificate and key (PEM files).
struct ClientTls {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

// POST `body` to `path` on 127.0.0.1:`port` (HTTPS when `tls` is set): the status (0 when there
// was no response: the body then says why) and the body.
std::pair<int, std::string> PostJson(int port, const std::string& path, const nlohmann::json& body,
                                     const ClientTls* tls = nullptr,
                                     absl::Duration timeout = absl::Seconds(60));

// What a client saw of a streamed response: its status (0: none), the body, and when each SSE
// event ("data: ") arrived, counted from the request's write.
struct Stream {
  int status = 0;
  std::string all;  // the body; "[client: ...]" appended when the response did not complete
  std::vector<absl::Duration> event_times;
  bool done = false;  // the response completed and "data: [DONE]" arrived
};

// Sends `body` as a streamed POST to `path` on `port` and reads (at most `timeout`) until the
// response ends. `first_event`, when given, is set once the first event arrived.
Stream PostStream(int port, const std::string& path, const std::string& body,
                  const ClientTls* tls = nullptr, absl::Duration timeout = absl::Seconds(60),
                  std::atomic<bool>* first_event = nullptr);

// GET /metrics of the duet HTTP front (or a node's exporter) on `port`; "" when the scrape fails.
std::string ScrapeMetrics(int port, const ClientTls* tls = nullptr);
// The sum of metric `name`'s samples in Prometheus text `metrics` whose labels contain each of
// `label_parts` (e.g. "code=\"200\""); -1 when it has none.
double SumSamples(const std::string& metrics, const std::string& name,
                  const std::vector<std::string>& label_parts = {});
// duet_http_requests_total of that front for `path` answered with `code` (summed over its other
// labels); -1 when the scrape fails.
double HttpRequests(int port, const std::string& path, int code, const ClientTls* tls = nullptr);

}  // namespace duet::testing
