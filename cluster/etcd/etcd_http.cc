#include "cluster/etcd/etcd_http.h"

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
                   absl::StrCat("etcd at ", endpoint.url, ": ", stage, ": ", ec.message(),
                                late ? " (call deadline passed)" : "")),
      ErrorCause{.endpoint = endpoint.url});
}

// Runs the io_context until the operation started before it completes; Beast's stream timeout
// bounds every operation, so this returns by the stream's expiry.
void RunOnce(asio::io_context& ioc) {
  ioc.run();
  ioc.restart();
}

}  // namespace

std::chrono::steady_clock::time_point SteadyTime(absl::Time t) {
  const absl::Duration left = std::clamp(t - absl::Now(), absl::ZeroDuration(), absl::Hours(24));
  return std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(left);
}

absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view url) {
  absl::string_view rest = url;
  if (absl::StartsWith(rest, "https://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint '", url, "': https is not supported (plain http only)"));
  }
  if (absl::StartsWith(rest, "http://")) rest.remove_prefix(7);
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  const size_t colon = rest.rfind(':');
  if (rest.empty() || rest.find('/') != absl::string_view::npos ||
      colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint '", url, "': expected http://HOST:PORT"));
  }
  Endpoint out;
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
  out.url = absl::StrCat("http://", rest);
  return out;
}

absl::StatusOr<HttpReply> PostJson(const Endpoint& endpoint, absl::string_view path,
                                   const std::string& body, absl::Time connect_deadline,
                                   absl::Time deadline, size_t max_response_bytes,
                                   bool* request_sent) {
  *request_sent = false;
  beast::error_code ec;
  const asio::ip::address address = asio::ip::make_address(endpoint.address, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd at ", endpoint.url, ": bad address ", endpoint.address));
  }
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);

  stream.expires_at(SteadyTime(std::min(connect_deadline, deadline)));
  stream.async_connect(tcp::endpoint(address, endpoint.port),
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
  stream.expires_at(SteadyTime(deadline));
  *request_sent = true;  // from here on the server may act on it
  http::async_write(stream, request, [&ec](const beast::error_code& e, size_t) { ec = e; });
  RunOnce(ioc);
  if (ec) return TransportError(endpoint, "send", ec, deadline);

  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(max_response_bytes);
  http::async_read(stream, buffer, parser, [&ec](const beast::error_code& e, size_t) { ec = e; });
  RunOnce(ioc);
  if (ec) return TransportError(endpoint, "reply", ec, deadline);

  HttpReply reply;
  reply.status = static_cast<int>(parser.get().result_int());
  reply.body = std::move(parser.get().body());
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);  // closing; errors do not matter
  return reply;
}

absl::StatusOr<std::shared_ptr<EndpointSet>> EndpointSet::Create(
    const std::vector<std::string>& urls, HttpLimits limits) {
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
                                                     endpoint->host, ": ", ec.message()));
    }
    endpoint->address = results.begin()->endpoint().address().to_string();
    endpoints.push_back(*std::move(endpoint));
  }
  return std::shared_ptr<EndpointSet>(new EndpointSet(std::move(endpoints), limits));
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
    absl::StatusOr<HttpReply> reply =
        PostJson(endpoint, path, body, std::min(deadline, now + limits_.connect_timeout), deadline,
                 limits_.max_response_bytes, &sent);
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
