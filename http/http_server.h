// HttpServer: an event-driven HTTP/1.1 server (Boost.Beast over Asio) for the OpenAI-compatible
// front. A few I/O threads serve every connection: reads, writes and deadlines are asynchronous,
// so a slow or idle client costs a socket and a little memory, never a thread.
//   - a new connection must deliver its request header within header_timeout, and the body
//     within body_timeout after the header (408 naming the deadline, then close);
//   - a kept-alive connection may idle up to idle_timeout between requests, then is closed;
//   - beyond max_connections open connections a new one gets 503 naming the limit;
//   - a response whose bytes stop moving (the socket accepts none of them for write_timeout: the
//     client does not read), or a streamed response whose unsent bytes exceed max_pending_bytes,
//     closes the connection (the client is too slow); a streamed response's kernel send buffer
//     is capped at stream_send_buffer_bytes, so that a client that reads nothing is seen after a
//     bounded number of bytes (TCP shows it only once its receive window is full);
//   - a refusal or a failure (400, 408, 413, 429, 431, 5xx; see ClosesConnection) is answered
//     with `Connection: close`, then the connection is closed after a lingering close of at most
//     2 s, whatever the client keeps sending;
//   - while a request is being answered the socket is still read, so a client that goes away is
//     seen at once (HttpResponder::gone()), streamed or not.
//   - HTTPS (options.tls): every connection is TLS, its handshake within header_timeout (then
//     closed, there being no channel to answer on); with a CA in the identity, a client must
//     present a certificate signed by it, and one that does not is refused in the handshake and
//     logged (WARNING) with its address and OpenSSL's reason.
// The handler runs on an I/O thread: it must answer quickly or hand the responder to another
// thread; HttpResponder is thread-safe and its writes are queued onto the connection's strand.
//
//   HttpServerOptions o{.host = "127.0.0.1", .port = 0};
//   DUET_ASSIGN_OR_RETURN(auto server, HttpServer::Start(o, [](HttpRequest req,
//       std::shared_ptr<HttpResponder> res) { res->Reply(200, {}, "text/plain", "hi"); }));
//   server->port();  ...  server->Stop();
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/tls/tls_files.h"

namespace duet::http {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  int io_threads = 2;
  size_t max_body_bytes = 1 << 20;
  size_t max_header_bytes = 16 << 10;
  int max_connections = 2048;
  absl::Duration header_timeout =
      absl::Seconds(10);  // from accept (or the first byte) to the header's end
  absl::Duration body_timeout = absl::Seconds(30);   // from the header's end to the body's end
  absl::Duration idle_timeout = absl::Seconds(30);   // keep-alive: between requests
  // Progress deadline: pending response bytes of which the socket accepts none for this long
  // close the connection (a responder then reports gone()).
  absl::Duration write_timeout = absl::Seconds(30);
  size_t max_pending_bytes = 4 << 20;  // queued, unsent response bytes
  // SO_SNDBUF of a connection once it starts a chunked response (the kernel doubles it); 0: the
  // kernel's autotuning, which on Linux lets up to tcp_wmem's max (4 MiB) sit unread.
  int stream_send_buffer_bytes = 32 << 10;
  // A chunked response that has sent nothing for this long gets `idle_chunk` (if set).
  absl::Duration chunk_ping_interval = absl::Seconds(1);
  // HTTPS with this certificate and key (tls_files.h); its CA, when set, is what client
  // certificates are verified against (and then required). nullopt: plain HTTP.
  std::optional<tls::TlsIdentity> tls;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query string
  HttpHeaders headers;
  std::string body;
  // The value of header `name` (case-insensitive), "" when absent.
  std::string Header(absl::string_view name) const;
};

// Answers one request. Exactly one of Reply() or StartChunked() ... EndChunked() per request;
// calls after the client has gone are dropped. Thread-safe.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  // A whole response with Content-Length.
  virtual void Reply(int status, const HttpHeaders& headers, absl::string_view content_type,
                     std::string body) = 0;
  // The head of a chunked response; `idle_chunk` (may be empty) is sent when the response has
  // been silent for chunk_ping_interval.
  virtual void StartChunked(int status, const HttpHeaders& headers, absl::string_view content_type,
                            std::string idle_chunk) = 0;
  // False when the client has gone (or was cut off as too slow): stop producing.
  virtual bool WriteChunk(std::string data) = 0;
  virtual void EndChunked() = 0;
  // The client closed or reset the connection, or it was closed (deadline, too slow, Stop).
  virtual bool gone() const = 0;
};

using HttpHandler = std::function<void(HttpRequest, std::shared_ptr<HttpResponder>)>;
// Called once per response head written: (path, status), for request metrics.
using HttpResponseLogger = std::function<void(const std::string& path, int status)>;
// The body (and its content type) of an error the server answers itself: a deadline (408), a
// body or header over its limit (413, 431), a malformed request (400), the connection limit
// (503). `code` is a short machine name ("header_timeout"), `message` names the cause.
struct HttpErrorBody {
  std::string content_type;
  std::string body;
};
using HttpErrorFormatter =
    std::function<HttpErrorBody(int status, const std::string& code, const std::string& message)>;

// True for the statuses after which the server closes the connection (`Connection: close`, then
// a lingering close): a refused or failed request (400, 408, 413, 429, 431, any 5xx).
bool ClosesConnection(int status);

class HttpServer {
 public:
  // The callbacks run on I/O threads; `logger` and `error_body` may be null (plain-text errors).
  // Every responder must be released before the server is destroyed.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpHandler handler,
                                                           HttpResponseLogger logger = nullptr,
                                                           HttpErrorFormatter error_body = nullptr);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Open connections now.
  int connections() const;
  // Stops accepting, closes every connection and joins the I/O threads. Idempotent. Responders
  // still held elsewhere report gone() afterwards.
  void Stop();

  class Impl;  // http_server.cc

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace duet::http
