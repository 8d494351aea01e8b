// Connection: one connection to an etcd member, plain TCP for http:// endpoints or TLS for
// https:// ones (the server's certificate checked against the CA and the endpoint's host; the
// client's certificate presented when the context has one). Internal to cluster/etcd: the
// client's calls (etcd_http.cc) and watches (etcd_watch.cc) read and write through it with
// Boost.Beast.
//
//   Connection c(ioc, endpoint.tls ? set->tls_context() : nullptr);
//   c.ExpiresAt(SteadyTime(deadline));
//   c.AsyncConnect(peer, endpoint.host, [](const beast::error_code& ec) { ... });
//   c.Visit([&](auto& stream) { http::async_write(stream, request, on_written); });
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include "absl/functional/any_invocable.h"

namespace duet::etcd {

// `ec`'s message, "TLS: ..." for OpenSSL's errors (a refused certificate reads "TLS: sslv3
// alert bad certificate"; under TLS 1.3 etcd refuses a client's certificate after the
// handshake, so that shows on the first read).
inline std::string DescribeError(const boost::beast::error_code& ec) {
  const bool ssl = ec.category() == boost::asio::error::get_ssl_category() ||
                   ec.category() == boost::asio::ssl::error::get_stream_category();
  return ssl ? "TLS: " + ec.message() : ec.message();
}

class Connection {
 public:
  using TcpStream = boost::beast::tcp_stream;
  using TlsStream = boost::beast::ssl_stream<boost::beast::tcp_stream>;
  using Handler = absl::AnyInvocable<void(const boost::beast::error_code&)>;

  // `tls` null: plain TCP; else TLS with that context (it must outlive the connection).
  Connection(boost::asio::io_context& ioc, boost::asio::ssl::context* tls) {
    if (tls == nullptr) {
      plain_.emplace(ioc);
    } else {
      secure_.emplace(ioc, *tls);
    }
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  bool tls() const { return secure_.has_value(); }

  // The deadline of the operations started afterwards (Beast's stream timeout).
  void ExpiresAt(std::chrono::steady_clock::time_point t) { Lowest().expires_at(t); }
  void ExpiresAfter(std::chrono::steady_clock::duration d) { Lowest().expires_after(d); }
  void ExpiresNever() { Lowest().expires_never(); }

  // Connects to `peer`; over TLS, then handshakes, the server's certificate verified for `host`
  // (an IP address is matched against the certificate's IP subject alternative names). `done`
  // gets the first error, or success once the connection is ready for requests.
  void AsyncConnect(const boost::asio::ip::tcp::endpoint& peer, const std::string& host,
                    Handler done) {
    Lowest().async_connect(
        peer, [this, host, done = std::move(done)](const boost::beast::error_code& ec) mutable {
          if (ec || !secure_.has_value()) {
            done(ec);
            return;
          }
          Handshake(host, std::move(done));
        });
  }

  // Calls `op` with the stream to read and write (TcpStream& or TlsStream&).
  template <typename Op>
  decltype(auto) Visit(Op&& op) {
    if (secure_.has_value()) return op(*secure_);
    return op(*plain_);
  }

  boost::asio::ip::tcp::socket& socket() { return Lowest().socket(); }
  // Closes the socket (no TLS close_notify: etcd takes a closed connection as the end).
  void Close() { Lowest().close(); }

 private:
  TcpStream& Lowest() { return secure_.has_value() ? secure_->next_layer() : *plain_; }

  void Handshake(const std::string& host, Handler done) {
    boost::beast::error_code ec;
    boost::asio::ip::make_address(host, ec);
    // SNI for names only (RFC 6066 forbids an IP address there).
    if (ec && !SSL_set_tlsext_host_name(secure_->native_handle(), host.c_str())) {
      done(boost::beast::error_code(static_cast<int>(::ERR_get_error()),
                                    boost::asio::error::get_ssl_category()));
      return;
    }
    secure_->set_verify_callback(boost::asio::ssl::host_name_verification(host), ec);
    if (ec) {
      done(ec);
      return;
    }
    secure_->async_handshake(
        boost::asio::ssl::stream_base::client,
        [done = std::move(done)](const boost::beast::error_code& e) mutable { done(e); });
  }

  std::optional<TcpStream> plain_;
  std::optional<TlsStream> secure_;
};

}  // namespace duet::etcd
