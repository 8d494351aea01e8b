// A connection's byte stream for HttpServer (http_server.cc, its internals): the TCP socket or
// TLS over it behind one Asio stream interface, the peer's address for log lines, and the
// lingering refusal of a connection over the limit.
//
//   internal::Stream stream(std::move(socket), tls_context_or_null);
//   bhttp::async_read(stream, buffer, parser, handler);
//   std::make_shared<internal::Refusal>(std::move(socket), tls, "HTTP/1.1 503 ...")->Start();
#pragma once

#include <array>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace duet::http::internal {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

// A connection's byte stream: the TCP socket itself, or TLS over it. Beast reads and writes it
// as any Asio stream; the socket underneath is there for what TLS leaves to TCP (options,
// cancel, shutdown, close).
class Stream {
 public:
  using executor_type = tcp::socket::executor_type;

  Stream(tcp::socket socket, asio::ssl::context* tls) {
    if (tls != nullptr) {
      tls_.emplace(std::move(socket), *tls);
    } else {
      plain_.emplace(std::move(socket));
    }
  }

  bool tls() const { return tls_.has_value(); }
  tcp::socket& socket() { return tls_ ? tls_->next_layer() : *plain_; }
  executor_type get_executor() { return socket().get_executor(); }

  template <typename Buffers, typename Handler>
  void async_read_some(const Buffers& buffers, Handler&& handler) {
    if (tls_) {
      tls_->async_read_some(buffers, std::forward<Handler>(handler));
    } else {
      plain_->async_read_some(buffers, std::forward<Handler>(handler));
    }
  }
  template <typename Buffers, typename Handler>
  void async_write_some(const Buffers& buffers, Handler&& handler) {
    if (tls_) {
      tls_->async_write_some(buffers, std::forward<Handler>(handler));
    } else {
      plain_->async_write_some(buffers, std::forward<Handler>(handler));
    }
  }
  // TLS only: the server side of the handshake.
  template <typename Handler>
  void async_handshake(Handler&& handler) {
    tls_->async_handshake(asio::ssl::stream_base::server, std::forward<Handler>(handler));
  }

 private:
  std::optional<tcp::socket> plain_;
  std::optional<asio::ssl::stream<tcp::socket>> tls_;
};

// "1.2.3.4:5678" of the socket's peer, "?" when it has none.
std::string PeerOf(tcp::socket& socket);

// A connection over the limit: its 503 (over TLS after the handshake, with HTTPS), then FIN and
// what the client still sends dropped, all within 2 s, so that the close does not reset the
// connection before the client reads the answer.
class Refusal : public std::enable_shared_from_this<Refusal> {
 public:
  Refusal(tcp::socket socket, asio::ssl::context* tls, std::string out)
      : stream_(std::move(socket), tls), timer_(stream_.get_executor()), out_(std::move(out)) {}
  void Start();

 private:
  void Write();
  void Discard();
  void Close();

  Stream stream_;
  asio::steady_timer timer_;
  const std::string out_;
  std::array<char, 4096> buf_;
};

}  // namespace duet::http::internal
