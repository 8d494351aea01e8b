#include "cluster/etcd/etcd_http.h"

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster/etcd/etcd_connection.h"
#include "cluster/etcd/etcd_json.h"
#include "cluster/etcd/etcd_types.h"

namespace duet::etcd {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// A failure without an HTTP reply: DeadlineExceeded once `deadline` passed, else Unavailable.
absl::Status TransportError(const Endpoint& endpoint, absl::string_view stage,
                            const beast::error_code& ec, absl::Time deadline) {
  const bool late = absl::Now() >= deadline;
  return WithErrorCause(
      absl::Status(late ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable,
                   absl::StrCat("etcd at ", endpoint.url, ": ", stage, ": ", DescribeError(ec),
                                late ? " (call deadline passed)" : "")),
      ErrorCause{.endpoint = endpoint.url});
}

// Runs the io_context until the operation started before it completes; Beast's stream timeout
// bounds every operation, so this returns by the stream's expiry.
void RunOnce(asio::io_context& ioc) {
  ioc.run();
  ioc.restart();
}

// The client side of TLS to etcd from `files`, read and checked (tls_files.h) first so that a bad
// file is named; TLS 1.2 or later, the server's certificate verified.
absl::StatusOr<std::unique_ptr<asio::ssl::context>> MakeTlsContext(const tls::TlsFiles& files) {
  if (files.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "etcd client: https endpoints need a CA file (what etcd's certificate must chain to)");
  }
  if (files.cert_file.empty() != files.key_file.empty()) {
    return absl::InvalidArgumentError(
        "etcd client: a client certificate needs both its certificate and its key file");
  }
  tls::TlsIdentity identity;
  if (files.cert_file.empty()) {
    absl::StatusOr<std::string> ca = tls::LoadCaBundle(files.ca_file);
    if (!ca.ok()) return ca.status();
    identity.ca_pem = *std::move(ca);
  } else {
    absl::StatusOr<tls::TlsIdentity> loaded = tls::LoadTlsIdentity(files);
    if (!loaded.ok()) return loaded.status();
    identity = *std::move(loaded);
  }
  auto context = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_client);
  beast::error_code ec;
  context->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                           asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                           asio::ssl::context::no_tlsv1_1,
                       ec);
  if (!ec) context->set_verify_mode(asio::ssl::verify_peer, ec);
  if (!ec) context->add_certificate_authority(asio::buffer(identity.ca_pem), ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd client: CA file ", files.ca_file, ": ", DescribeError(ec)));
  }
  if (!identity.cert_pem.empty()) {
    context->use_certificate_chain(asio::buffer(identity.cert_pem), ec);
    if (!ec) {
      context->use_private_key(asio::buffer(identity.key_pem), asio::ssl::context::pem, ec);
    }
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat("etcd client: certificate ", files.cert_file,
                                                     " / key ", files.key_file, ": ",
                                                     ec.message()));
    }
  }
  return context;
}

}  // namespace

std::chrono::steady_clock::time_point SteadyTime(absl::Time t) {
  const absl::Duration left = std::clamp(t - absl::Now(), absl::ZeroDuration(), absl::Hours(24));
  return std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(left);
}

absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view url) {
  absl::string_view rest = url;
  Endpoint out;
  if (absl::StartsWith(rest, "https://")) {
    out.tls = true;
    rest.remove_prefix(8);
  } else if (absl::StartsWith(rest, "http://")) {
    rest.remove_prefix(7);
  } else if (absl::StrContains(rest, "://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint '", url, "': expected http:// or https://"));
  }
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  const size_t colon = rest.rfind(':');
  if (rest.empty() || rest.find('/') != absl::string_view::npos ||
      colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint '", url, "': expected http(s)://HOST:PORT"));
  }
  out.host = std::string(rest.substr(0, colon));
  const absl::string_view port = rest.substr(colon + 1);
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("etcd endpoint '", url, "': bad port"));
  }
  out.port = static_cast<uint16_t>(value);
  if (out.host.size() > 2 && out.host.front() == '[' && out.host.back() == ']') {
    out.host = out.host.substr(1, out.host.size() - 2);  // [::1]
  }
  out.url = absl::StrCat(out.tls ? "https://" : "http://", rest);
  return out;
}

absl::StatusOr<HttpReply> PostJson(const Endpoint& endpoint, asio::ssl::context* tls,
                                   absl::string_view path, const std::string& body,
                                   absl::Time connect_deadline, absl::Time deadline,
                                   size_t max_response_bytes, bool* request_sent) {
  *request_sent = false;
  beast::error_code ec;
  const asio::ip::address address = asio::ip::make_address(endpoint.address, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd at ", endpoint.url, ": bad address ", endpoint.address));
  }
  if (endpoint.tls && tls == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("etcd at ", endpoint.url, ": no TLS context"));
  }
  asio::io_context ioc;
  Connection stream(ioc, endpoint.tls ? tls : nullptr);

  stream.ExpiresAt(SteadyTime(std::min(connect_deadline, deadline)));
  stream.AsyncConnect(tcp::endpoint(address, endpoint.port), endpoint.host,
                      [&ec](const beast::error_code& e) { ec = e; });
  RunOnce(ioc);
  if (ec) return TransportError(endpoint, "connect", ec, deadline);

  http::request<http::string_body> request{http::verb::post, std::string(path), 11};
  request.set(http::field::host, absl::StrCat(endpoint.host, ":", endpoint.port));
  request.set(http::field::content_type, "application/json");
  request.set(http::field::user_agent, "duet-etcd");
  request.keep_alive(false);
  request.body() = body;
  request.prepare_payload();
  stream.ExpiresAt(SteadyTime(deadline));
  *request_sent = true;  // from here on the server may act on it
  stream.Visit([&](auto& s) {
    http::async_write(s, request, [&ec](const beast::error_code& e, size_t) { ec = e; });
  });
  RunOnce(ioc);
  if (ec) return TransportError(endpoint, "send", ec, deadline);

  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(max_response_bytes);
  stream.Visit([&](auto& s) {
    http::async_read(s, buffer, parser, [&ec](const beast::error_code& e, size_t) { ec = e; });
  });
  RunOnce(ioc);
  if (ec) return TransportError(endpoint, "reply", ec, deadline);

  HttpReply reply;
  reply.status = static_cast<int>(parser.get().result_int());
  reply.body = std::move(parser.get().body());
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);  // closing; errors do not matter
  return reply;
}

EndpointSet::EndpointSet(std::vector<Endpoint> endpoints, HttpLimits limits,
                         std::unique_ptr<asio::ssl::context> tls)
    : endpoints_(std::move(endpoints)), limits_(limits), tls_(std::move(tls)) {}

EndpointSet::~EndpointSet() = default;

absl::StatusOr<std::shared_ptr<EndpointSet>> EndpointSet::Create(
    const std::vector<std::string>& urls, HttpLimits limits,
    const std::optional<tls::TlsFiles>& tls) {
  if (urls.empty()) return absl::InvalidArgumentError("etcd client: no endpoints");
  std::vector<Endpoint> endpoints;
  asio::io_context ioc;
  tcp::resolver resolver(ioc);
  for (const std::string& url : urls) {
    absl::StatusOr<Endpoint> endpoint = ParseEndpoint(url);
    if (!endpoint.ok()) return endpoint.status();
    beast::error_code ec;
    const tcp::resolver::results_type results =
        resolver.resolve(endpoint->host, std::to_string(endpoint->port), ec);
    if (ec || results.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("etcd endpoint '", url, "': cannot resolve ",
                                                     endpoint->host, ": ", DescribeError(ec)));
    }
    endpoint->address = results.begin()->endpoint().address().to_string();
    if (!endpoints.empty() && endpoint->tls != endpoints.front().tls) {
      return absl::InvalidArgumentError(absl::StrCat("etcd endpoints ", endpoints.front().url,
                                                     " and ", endpoint->url,
                                                     ": all http:// or all https://"));
    }
    endpoints.push_back(*std::move(endpoint));
  }
  std::unique_ptr<asio::ssl::context> context;
  if (endpoints.front().tls) {
    if (!tls.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("etcd endpoint ", endpoints.front().url,
                                                     ": https needs TLS files (at least a CA)"));
    }
    absl::StatusOr<std::unique_ptr<asio::ssl::context>> made = MakeTlsContext(*tls);
    if (!made.ok()) return made.status();
    context = *std::move(made);
  } else if (tls.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd client: TLS files given, but endpoint ",
                                                   endpoints.front().url, " is plain http"));
  }
  return std::shared_ptr<EndpointSet>(
      new EndpointSet(std::move(endpoints), limits, std::move(context)));
}

size_t EndpointSet::preferred() const {
  absl::MutexLock lock(&mu_);
  return preferred_;
}

void EndpointSet::SetPreferred(size_t index) {
  absl::MutexLock lock(&mu_);
  preferred_ = index;
}

absl::StatusOr<nlohmann::json> EndpointSet::Call(absl::string_view path, const std::string& body,
                                                 absl::Time deadline, Idempotent idempotent,
                                                 std::string* endpoint_used) {
  const size_t start = preferred();
  absl::Status last = absl::DeadlineExceededError(
      absl::StrCat("etcd ", path, ": the call's deadline passed before any endpoint was tried"));
  std::vector<std::string> tried;
  for (size_t k = 0; k < endpoints_.size(); ++k) {
    const size_t i = (start + k) % endpoints_.size();
    const Endpoint& endpoint = endpoints_[i];
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    bool sent = false;
    absl::StatusOr<HttpReply> reply = PostJson(endpoint, tls_.get(), path, body,
                                               std::min(deadline, now + limits_.connect_timeout),
                                               deadline, limits_.max_response_bytes, &sent);
    if (!reply.ok()) {
      last = reply.status();
      tried.push_back(endpoint.url);
      if (last.code() == absl::StatusCode::kDeadlineExceeded) break;
      if (sent && idempotent == Idempotent::kNo) break;  // it may have been applied
      continue;
    }
    SetPreferred(i);
    if (endpoint_used != nullptr) *endpoint_used = endpoint.url;
    return ParseReply(reply->status, reply->body, endpoint.url);
  }
  if (tried.size() <= 1) return last;
  // Keep the last failure's code and cause; name every member tried.
  absl::Status all(last.code(),
                   absl::StrCat("etcd ", path, ": no endpoint answered (tried ",
                                absl::StrJoin(tried, ", "), "); last: ", last.message()));
  last.ForEachPayload(
      [&all](absl::string_view url, const absl::Cord& payload) { all.SetPayload(url, payload); });
  return all;
}

}  // namespace duet::etcd
