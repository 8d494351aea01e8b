// The HTTP side of duet's etcd client, internal to cluster/etcd: endpoints, one POST to the JSON
// gateway over Boost.Beast with deadlines (over TLS for https:// endpoints), and the endpoint
// set that fails over from one etcd member to the next (docs/design.md §4.8).
//
//   DUET_ASSIGN_OR_RETURN(auto set, EndpointSet::Create({"http://127.0.0.1:2379"}, limits,
//                                                       std::nullopt));
//   DUET_ASSIGN_OR_RETURN(nlohmann::json r, set->Call("/v3/kv/range", body, deadline,
//                                                     Idempotent::kYes));
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tls/tls_files.h"
#include "nlohmann/json.hpp"

namespace boost::asio::ssl {
class context;
}  // namespace boost::asio::ssl

namespace duet::etcd {

// One etcd member's client URL, "http://HOST:PORT" (or "HOST:PORT") or "https://HOST:PORT"; HOST
// is resolved once, when the client is created (so no call waits on DNS).
struct Endpoint {
  std::string url;   // as given, normalised to "http://HOST:PORT" or "https://HOST:PORT"
  std::string host;  // for the Host header, SNI and the server certificate's check
  uint16_t port = 0;
  bool tls = false;     // https://
  std::string address;  // the resolved IP address connected to
};

// `t` as the steady clock's time point that Asio's timers take (at most a day ahead).
std::chrono::steady_clock::time_point SteadyTime(absl::Time t);

// Parses an endpoint URL (no resolution). Other schemes and paths are refused: InvalidArgument.
absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view url);

struct HttpLimits {
  absl::Duration connect_timeout = absl::Seconds(1);  // per endpoint, within the call's deadline
  size_t max_response_bytes = size_t{64} << 20;
};

// One finished HTTP exchange.
struct HttpReply {
  int status = 0;
  std::string body;
};

// POSTs `body` (JSON) to `path` on `endpoint` on a connection of its own, closed afterwards
// (TLS with `tls` for an https endpoint). Connect (and the TLS handshake) must finish by
// `connect_deadline`, the whole exchange by `deadline`. A failure before a reply is Unavailable
// (DeadlineExceeded past `deadline`) with the cause attached; `*request_sent` says whether the
// request may have reached the server.
absl::StatusOr<HttpReply> PostJson(const Endpoint& endpoint, boost::asio::ssl::context* tls,
                                   absl::string_view path, const std::string& body,
                                   absl::Time connect_deadline, absl::Time deadline,
                                   size_t max_response_bytes, bool* request_sent);

// Whether a call may be sent again to another member after it may have reached one.
enum class Idempotent { kNo, kYes };

// The members a client talks to, the one that answered last first. Thread-safe.
class EndpointSet {
 public:
  // `tls`: for https endpoints (all or none of them are): ca_file required (what etcd's server
  // certificate must chain to), cert_file and key_file both or neither (the client certificate
  // etcd's --client-cert-auth asks for); read and checked here. InvalidArgument naming the
  // endpoint or file for mixed schemes, https without `tls`, `tls` with http endpoints, or
  // files that do not load.
  static absl::StatusOr<std::shared_ptr<EndpointSet>> Create(
      const std::vector<std::string>& urls, HttpLimits limits,
      const std::optional<tls::TlsFiles>& tls);
  ~EndpointSet();

  // POSTs to the members in turn, starting with the preferred one, until one gives an HTTP reply:
  // the next is tried when the connection fails, or when it breaks after the request went out
  // and the call is idempotent. Returns the reply's response object (etcd_json.h ParseReply).
  absl::StatusOr<nlohmann::json> Call(absl::string_view path, const std::string& body,
                                      absl::Time deadline, Idempotent idempotent,
                                      std::string* endpoint_used = nullptr);

  const std::vector<Endpoint>& endpoints() const { return endpoints_; }
  const HttpLimits& limits() const { return limits_; }
  // The TLS context of https endpoints; null for http ones.
  boost::asio::ssl::context* tls_context() const { return tls_.get(); }
  size_t preferred() const;
  void SetPreferred(size_t index);

 private:
  EndpointSet(std::vector<Endpoint> endpoints, HttpLimits limits,
              std::unique_ptr<boost::asio::ssl::context> tls);

  const std::vector<Endpoint> endpoints_;
  const HttpLimits limits_;
  const std::unique_ptr<boost::asio::ssl::context> tls_;
  mutable absl::Mutex mu_;
  size_t preferred_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace duet::etcd
