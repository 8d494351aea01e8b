#include "http/http_server.h"

#include <array>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <deque>
#include <optional>
#include <thread>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/logging.h"
#include "http/connection_stream.h"

namespace duet::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

std::chrono::nanoseconds Chrono(absl::Duration d) { return absl::ToChronoNanoseconds(d); }

std::string Seconds(absl::Duration d) { return absl::StrCat(absl::ToDoubleSeconds(d), " s"); }

std::string StatusLine(int status) {
  const beast::string_view reason = bhttp::obsolete_reason(bhttp::int_to_status(status));
  return absl::StrCat("HTTP/1.1 ", status, " ", absl::string_view(reason.data(), reason.size()),
                      "\r\n");
}

std::string Chunk(absl::string_view data) {
  return absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n");
}

using internal::PeerOf;
using internal::Refusal;
using internal::Stream;

}  // namespace

bool ClosesConnection(int status) {
  return status == 400 || status == 408 || status == 413 || status == 429 || status == 431 ||
         status >= 500;
}

std::string HttpRequest::Header(absl::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (absl::EqualsIgnoreCase(k, name)) return v;
  }
  return "";
}

class Session;

class HttpServer::Impl {
 public:
  Impl(const HttpServerOptions& options, HttpHandler handler, HttpResponseLogger logger,
       HttpErrorFormatter error_body)
      : options_(options),
        handler_(std::move(handler)),
        logger_(std::move(logger)),
        error_body_(std::move(error_body)),
        ioc_(std::max(1, options.io_threads)),
        acceptor_(asio::make_strand(ioc_)),
        retry_timer_(acceptor_.get_executor()) {}
  ~Impl() { Stop(); }

  absl::Status Listen();
  void Stop();
  // The TLS context of every connection; nullptr: plain HTTP.
  asio::ssl::context* tls() { return tls_ ? &*tls_ : nullptr; }

  HttpErrorBody ErrorBody(int status, const std::string& code, const std::string& message) const {
    if (error_body_) return error_body_(status, code, message);
    return {"text/plain; charset=utf-8", absl::StrCat(code, ": ", message, "\n")};
  }
  void Log(const std::string& path, int status) const {
    if (logger_) logger_(path, status);
  }

  const HttpServerOptions options_;
  const HttpHandler handler_;
  const HttpResponseLogger logger_;
  const HttpErrorFormatter error_body_;
  std::atomic<int> connections_{0};
  std::atomic<bool> stopping_{false};
  int port_ = 0;

  void Register(Session* s, std::weak_ptr<Session> w) {
    absl::MutexLock lock(&mu_);
    sessions_[s] = std::move(w);
  }
  void Unregister(Session* s) {
    absl::MutexLock lock(&mu_);
    sessions_.erase(s);
  }

 private:
  void Accept();
  void Refuse(tcp::socket socket);

  absl::Status SetUpTls();

  std::optional<asio::ssl::context> tls_;  // set up by Listen, read-only afterwards
  absl::Mutex mu_;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  absl::Mutex threads_mu_;
  int running_threads_ ABSL_GUARDED_BY(threads_mu_) = 0;
  std::vector<std::thread> threads_;
  // Last: destroyed first, with the handlers (and sessions) it still holds.
  asio::io_context ioc_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_timer_;
};

// One connection: read a request (header, then body, each under its deadline), hand it to the
// handler, write its response, and either read the next one (keep-alive, under the idle
// deadline) or close. Every member is touched on the connection's strand only, except the
// atomics the responder reads.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer::Impl* server)
      : server_(server),
        options_(server->options_),
        stream_(std::move(socket), server->tls()),
        socket_(stream_.socket()),
        read_timer_(stream_.get_executor()),
        write_timer_(stream_.get_executor()),
        ping_timer_(stream_.get_executor()) {
    server_->connections_.fetch_add(1);
  }
  ~Session() {
    server_->Unregister(this);
    server_->connections_.fetch_sub(1);
  }

  template <typename F>
  void Post(F&& f) {
    asio::post(stream_.get_executor(), std::forward<F>(f));
  }

  void Start() {
    if (!stream_.tls()) return StartHeader();
    // The handshake, under the header's deadline; a refused client is logged here, there being
    // no channel to answer it on.
    state_ = State::kHandshake;
    ArmRead(options_.header_timeout);
    stream_.async_handshake([self = shared_from_this()](error_code ec) {
      if (self->state_ != State::kHandshake) return;  // timed out or closed meanwhile
      if (ec == asio::ssl::error::stream_truncated || ec == asio::error::eof ||
          ec == asio::error::connection_reset) {
        return self->Close(
            absl::StrCat("the client left during the TLS handshake (", ec.message(), ")"));
      }
      if (ec) {
        DUET_LOG(WARNING) << "https: refused " << PeerOf(self->socket_)
                          << " in the TLS handshake: " << ec.message();
        return self->Close(absl::StrCat("TLS handshake failed: ", ec.message()));
      }
      self->StartHeader();
    });
  }
  void Close(const std::string& why) {
    if (state_ == State::kClosed) return;
    DUET_LOG(DEBUG) << "http: closing a connection: " << why;
    state_ = State::kClosed;
    gone_.store(true);
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    read_timer_.cancel();
    write_timer_.cancel();
    ping_timer_.cancel();
  }

  // ---- Called by the responder (on the strand).
  void Respond(int status, const HttpHeaders& headers, absl::string_view content_type,
               std::string body) {
    if (state_ != State::kHandling || response_started_) return;
    response_started_ = true;
    if (ClosesConnection(status)) {
      // A refusal: `Connection: close`, then a lingering close once it is written.
      keep_alive_ = false;
      state_ = State::kClosing;
    }
    std::string out = Head(status, headers, content_type);
    absl::StrAppend(&out, "Content-Length: ", body.size(), "\r\n\r\n");
    if (!head_only_) out += body;  // HEAD: the GET's head alone
    server_->Log(path_, status);
    response_done_ = true;
    Enqueue(std::move(out));
  }
  void StartChunks(int status, const HttpHeaders& headers, absl::string_view content_type,
                   std::string idle_chunk) {
    if (state_ != State::kHandling || response_started_) return;
    response_started_ = true;
    std::string out = Head(status, headers, content_type);
    absl::StrAppend(&out, "Transfer-Encoding: chunked\r\n\r\n");
    server_->Log(path_, status);
    idle_chunk_ = std::move(idle_chunk);
    if (options_.stream_send_buffer_bytes > 0) {
      // Small, so that a client that reads nothing stalls the writes after a bounded number of
      // bytes and meets the write deadline (autotuning would let megabytes sit unread).
      error_code ignored;
      socket_.set_option(asio::socket_base::send_buffer_size(options_.stream_send_buffer_bytes),
                         ignored);
    }
    Enqueue(std::move(out));
    if (!idle_chunk_.empty()) ArmPing();
  }
  void SendChunk(std::string data) {
    if (state_ != State::kHandling || !response_started_ || response_done_) return;
    if (data.empty()) return;  // an empty chunk would end the response
    Enqueue(Chunk(data));
  }
  void EndChunks() {
    if (state_ != State::kHandling || !response_started_ || response_done_) return;
    response_done_ = true;
    ping_timer_.cancel();
    Enqueue("0\r\n\r\n");
  }
  void TooSlow() {
    Close(absl::StrCat("the client reads too slowly (more than ", options_.max_pending_bytes,
                       " response bytes unsent)"));
  }

  std::atomic<bool> gone_{false};
  std::atomic<size_t> pending_bytes_{0};  // handed to the strand, not yet written

 private:
  // kClosing: an error of the server's own is being written; kLingering: it was, the write side
  // is shut and what the client still sends is read and dropped for a while, so that closing
  // does not reset the connection before the client has read the answer.
  enum class State { kHandshake, kIdle, kHeader, kBody, kHandling, kClosing, kLingering, kClosed };

  std::string Head(int status, const HttpHeaders& headers, absl::string_view content_type) {
    std::string out = StatusLine(status);
    for (const auto& [k, v] : headers) absl::StrAppend(&out, k, ": ", v, "\r\n");
    if (!content_type.empty()) absl::StrAppend(&out, "Content-Type: ", content_type, "\r\n");
    if (keep_alive_ && !server_->stopping_.load()) {
      absl::StrAppend(&out, "Connection: keep-alive\r\nKeep-Alive: timeout=",
                      absl::ToInt64Seconds(options_.idle_timeout), "\r\n");
    } else {
      keep_alive_ = false;
      absl::StrAppend(&out, "Connection: close\r\n");
    }
    return out;
  }

  // ---- Deadlines. A generation count makes a timer that fired late harmless.
  void ArmRead(absl::Duration d) {
    const uint64_t gen = ++read_gen_;
    read_timer_.expires_after(Chrono(d));
    read_timer_.async_wait([self = shared_from_this(), gen](error_code ec) {
      if (ec || gen != self->read_gen_) return;
      self->OnReadDeadline();
    });
  }
  void DisarmRead() {
    ++read_gen_;
    read_timer_.cancel();
  }
  void OnReadDeadline() {
    switch (state_) {
      case State::kHandshake:
        DUET_LOG(WARNING) << "https: " << PeerOf(socket_)
                          << " did not complete the TLS handshake within "
                          << Seconds(options_.header_timeout);
        Close(absl::StrCat("no TLS handshake within ", Seconds(options_.header_timeout)));
        break;
      case State::kIdle:
        Close(absl::StrCat("idle for ", Seconds(options_.idle_timeout), " between requests"));
        break;
      case State::kHeader:
        Fail(408, "header_timeout",
             absl::StrCat("the request header did not arrive within ",
                          Seconds(options_.header_timeout)));
        break;
      case State::kBody:
        Fail(408, "body_timeout",
             absl::StrCat("the request body did not arrive within ", Seconds(options_.body_timeout),
                          " of its header"));
        break;
      case State::kLingering:
        // However long the client keeps sending: the connection ends here.
        Close(absl::StrCat("closed ", Seconds(kLingerTime), " after an error answer"));
        break;
      default:
        break;
    }
  }

  // ---- Reading a request.
  void StartHeader() {
    state_ = State::kHeader;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(options_.max_header_bytes));
    parser_->body_limit(options_.max_body_bytes);
    ArmRead(options_.header_timeout);
    bhttp::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](error_code ec, size_t) { self->OnHeader(ec); });
  }
  void OnHeader(error_code ec) {
    if (state_ != State::kHeader) return;  // timed out or closed meanwhile
    if (ec) return OnReadError(ec);
    const auto& h = parser_->get();
    const beast::string_view expect = h[bhttp::field::expect];
    if (absl::EqualsIgnoreCase(absl::string_view(expect.data(), expect.size()), "100-continue") &&
        !parser_->is_done()) {
      Enqueue("HTTP/1.1 100 Continue\r\n\r\n");
    }
    if (parser_->is_done()) return Dispatch();
    state_ = State::kBody;
    ArmRead(options_.body_timeout);
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = shared_from_this()](error_code ec, size_t) { self->OnBody(ec); });
  }
  void OnBody(error_code ec) {
    if (state_ != State::kBody) return;
    if (ec) return OnReadError(ec);
    Dispatch();
  }
  void OnReadError(error_code ec) {
    if (ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted) {
      return Close(absl::StrCat("the client closed the connection (", ec.message(), ")"));
    }
    if (ec == bhttp::error::body_limit) {
      return Fail(413, "body_too_large",
                  absl::StrCat("the request body is larger than the server accepts (limit ",
                               options_.max_body_bytes, " bytes)"));
    }
    if (ec == bhttp::error::header_limit) {
      return Fail(431, "header_too_large",
                  absl::StrCat("the request header is larger than the server accepts (limit ",
                               options_.max_header_bytes, " bytes)"));
    }
    Fail(400, "bad_request", absl::StrCat("malformed HTTP request: ", ec.message()));
  }
  // Answers an error of the server's own and closes once it is written.
  void Fail(int status, const std::string& code, const std::string& message) {
    DUET_LOG(DEBUG) << "http: " << status << " " << code << ": " << message;
    DisarmRead();
    state_ = State::kClosing;
    error_code ignored;
    socket_.cancel(ignored);  // a pending read ends (aborted); it is not followed up
    const HttpErrorBody e = server_->ErrorBody(status, code, message);
    std::string out = StatusLine(status);
    if (status == 503) absl::StrAppend(&out, "Retry-After: 1\r\n");
    absl::StrAppend(&out, "Content-Type: ", e.content_type, "\r\nConnection: close\r\n",
                    "Content-Length: ", e.body.size(), "\r\n\r\n", e.body);
    server_->Log(path_.empty() ? "other" : path_, status);
    response_done_ = true;
    keep_alive_ = false;
    Enqueue(std::move(out));
  }

  void Dispatch();

  // While a request is answered, and between requests, the socket is read: EOF or an error
  // means the client has gone; bytes (a pipelined request) are kept for the next parse.
  void ReadSome() {
    if (reading_) return;
    reading_ = true;
    stream_.async_read_some(
        buffer_.prepare(4096),
        [self = shared_from_this()](error_code ec, size_t n) { self->OnReadSome(ec, n); });
  }
  void OnReadSome(error_code ec, size_t n) {
    reading_ = false;
    if (state_ == State::kLingering) {
      // A read begun before the error answer (a refusal of the handler's): what it got is
      // dropped, and the lingering close goes on reading.
      if (ec && ec != asio::error::operation_aborted) return Close("closed after an error answer");
      return Discard();
    }
    if (state_ == State::kClosed || state_ == State::kClosing) return;
    if (ec) {
      if (ec == asio::error::operation_aborted && restart_header_) {
        restart_header_ = false;
        return StartHeader();
      }
      if (state_ == State::kHandling) {
        gone_.store(true);
        return Close(
            absl::StrCat("the client went away before its response ended (", ec.message(), ")"));
      }
      return Close(absl::StrCat("the client closed an idle connection (", ec.message(), ")"));
    }
    buffer_.commit(n);
    if (state_ == State::kHandling) {
      if (buffer_.size() < options_.max_header_bytes) ReadSome();
      return;
    }
    if (state_ == State::kIdle) StartHeader();
  }

  // ---- Writing.
  void Enqueue(std::string data) {
    if (state_ == State::kClosed) return;
    out_.push_back(std::move(data));
    if (!writing_) WriteNext();
  }
  void WriteNext() {
    if (out_.empty()) {
      writing_ = false;
      return OnWritesDrained();
    }
    writing_ = true;
    batch_.clear();
    written_ = 0;
    for (std::string& s : out_) batch_ += s;
    out_.clear();
    last_write_ = last_progress_ = std::chrono::steady_clock::now();
    if (!write_watch_armed_) ArmWriteWatch(Chrono(options_.write_timeout));
    WriteSome();
  }
  // One write_some at a time, so that each byte the socket accepts counts as progress.
  void WriteSome() {
    stream_.async_write_some(
        asio::buffer(batch_.data() + written_, batch_.size() - written_),
        [self = shared_from_this()](error_code ec, size_t n) { self->OnWritten(ec, n); });
  }
  void OnWritten(error_code ec, size_t n) {
    const size_t p = pending_bytes_.load();
    pending_bytes_.fetch_sub(std::min(p, n));
    if (ec) {
      gone_.store(true);
      return Close(absl::StrCat("a write failed: ", ec.message()));
    }
    if (n > 0) last_progress_ = std::chrono::steady_clock::now();
    written_ += n;
    if (written_ < batch_.size()) return WriteSome();
    WriteNext();
  }
  // One timer per connection watches the writes in progress (cheaper than a timer per write):
  // when the socket has accepted none of the pending bytes for write_timeout (the client does
  // not read, and the kernel's buffers are full), the connection is closed; a responder then
  // reports gone(), and the front cancels the request as for a client that went away.
  void ArmWriteWatch(std::chrono::nanoseconds after) {
    write_watch_armed_ = true;
    write_timer_.expires_after(after);
    write_timer_.async_wait([self = shared_from_this()](error_code ec) {
      self->write_watch_armed_ = false;
      if (ec || self->state_ == State::kClosed || !self->writing_) return;
      const auto limit = Chrono(self->options_.write_timeout);
      const auto stalled = std::chrono::steady_clock::now() - self->last_progress_;
      if (stalled >= limit) {
        self->gone_.store(true);
        size_t unsent = self->batch_.size() - self->written_;
        for (const std::string& s : self->out_) unsent += s.size();
        return self->Close(absl::StrCat("the client has read nothing for ",
                                        Seconds(self->options_.write_timeout), " (", unsent,
                                        " response bytes unsent)"));
      }
      self->ArmWriteWatch(std::chrono::duration_cast<std::chrono::nanoseconds>(limit - stalled));
    });
  }

  void OnWritesDrained() {
    if (!response_done_) return;
    if (state_ == State::kClosing) return Linger();
    if (!keep_alive_ || server_->stopping_.load()) {
      return Close("the response is complete and the connection is not kept alive");
    }
    if (state_ != State::kHandling) return;
    // Keep-alive: the next request, or idle until it comes.
    state_ = State::kIdle;
    if (buffer_.size() > 0) {
      if (reading_) {
        restart_header_ = true;
        error_code ignored;
        socket_.cancel(ignored);
        return;
      }
      return StartHeader();
    }
    ArmRead(options_.idle_timeout);
    ReadSome();
  }

  // After an error answer: FIN to the client, then drop what it still sends (the rest of an
  // oversized body, say) until it closes, kLingerBytes arrived, or kLingerTime passed.
  static constexpr size_t kLingerBytes = 16 << 20;
  static constexpr absl::Duration kLingerTime = absl::Seconds(2);
  void Linger() {
    state_ = State::kLingering;
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    ArmRead(kLingerTime);  // OnReadDeadline closes, however long the client keeps sending
    discard_ = std::make_unique<char[]>(kDiscardSize);
    if (!reading_) Discard();  // else the read in flight goes on with it (OnReadSome)
  }
  void Discard() {
    stream_.async_read_some(asio::buffer(discard_.get(), kDiscardSize),
                            [self = shared_from_this()](error_code ec, size_t n) {
                              if (self->state_ != State::kLingering) return;
                              self->lingered_ += n;
                              if (ec || self->lingered_ > kLingerBytes) {
                                return self->Close("closed after an error answer");
                              }
                              self->Discard();
                            });
  }

  void ArmPing() {
    ping_timer_.expires_after(Chrono(options_.chunk_ping_interval));
    ping_timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec || self->state_ != State::kHandling || self->response_done_) return;
      // No ping while a write is stuck: the client has not read what is there already.
      if (!self->writing_ && std::chrono::steady_clock::now() - self->last_write_ >=
                                 Chrono(self->options_.chunk_ping_interval)) {
        self->Enqueue(Chunk(self->idle_chunk_));
      }
      self->ArmPing();
    });
  }

  HttpServer::Impl* const server_;
  const HttpServerOptions& options_;
  Stream stream_;
  tcp::socket& socket_;  // stream_'s, for what is TCP's alone
  asio::steady_timer read_timer_;
  asio::steady_timer write_timer_;
  asio::steady_timer ping_timer_;
  State state_ = State::kHeader;
  uint64_t read_gen_ = 0;
  bool write_watch_armed_ = false;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  bool reading_ = false;         // an async_read_some is pending
  bool restart_header_ = false;  // it was cancelled to parse a pipelined request
  std::string path_;
  bool head_only_ = false;
  bool keep_alive_ = true;
  bool response_started_ = false;
  bool response_done_ = false;
  std::string idle_chunk_;
  static constexpr size_t kDiscardSize = 16 << 10;
  std::unique_ptr<char[]> discard_;  // kLingering only
  size_t lingered_ = 0;
  std::deque<std::string> out_;
  std::string batch_;  // being written
  size_t written_ = 0;  // of batch_
  bool writing_ = false;
  std::chrono::steady_clock::time_point last_write_ =
      std::chrono::steady_clock::now();  // the start of the last write
  // The last time the socket accepted bytes of a write (or one started): the write deadline's.
  std::chrono::steady_clock::time_point last_progress_ = last_write_;
};

namespace {

class SessionResponder : public HttpResponder {
 public:
  explicit SessionResponder(std::shared_ptr<Session> s, size_t max_pending)
      : s_(std::move(s)), max_pending_(max_pending) {}

  void Reply(int status, const HttpHeaders& headers, absl::string_view content_type,
             std::string body) override {
    if (gone()) return;
    s_->pending_bytes_.fetch_add(body.size());
    s_->Post(
        [s = s_, status, headers, ct = std::string(content_type),
         body = std::move(body)]() mutable { s->Respond(status, headers, ct, std::move(body)); });
  }
  void StartChunked(int status, const HttpHeaders& headers, absl::string_view content_type,
                    std::string idle_chunk) override {
    if (gone()) return;
    s_->Post([s = s_, status, headers, ct = std::string(content_type),
              idle = std::move(idle_chunk)]() mutable {
      s->StartChunks(status, headers, ct, std::move(idle));
    });
  }
  bool WriteChunk(std::string data) override {
    if (gone()) return false;
    if (s_->pending_bytes_.fetch_add(data.size()) + data.size() > max_pending_) {
      s_->gone_.store(true);
      s_->Post([s = s_] { s->TooSlow(); });
      return false;
    }
    s_->Post([s = s_, data = std::move(data)]() mutable { s->SendChunk(std::move(data)); });
    return true;
  }
  void EndChunked() override {
    if (gone()) return;
    s_->Post([s = s_] { s->EndChunks(); });
  }
  bool gone() const override { return s_->gone_.load(); }

 private:
  const std::shared_ptr<Session> s_;
  const size_t max_pending_;
};

}  // namespace

void Session::Dispatch() {
  DisarmRead();
  state_ = State::kHandling;
  bhttp::request<bhttp::string_body> msg = parser_->release();
  parser_.reset();
  HttpRequest req;
  req.method = std::string(msg.method_string());
  const std::string target(msg.target().data(), msg.target().size());
  req.path = std::string(target.substr(0, target.find('?')));
  for (const auto& f : msg) {
    req.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  }
  req.body = std::move(msg.body());
  path_ = req.path;
  head_only_ = msg.method() == bhttp::verb::head;
  keep_alive_ = msg.keep_alive();
  response_started_ = false;
  response_done_ = false;
  ReadSome();  // sees the client go away
  server_->handler_(std::move(req), std::make_shared<SessionResponder>(shared_from_this(),
                                                                       options_.max_pending_bytes));
}

absl::Status HttpServer::Impl::SetUpTls() {
  if (!options_.tls) return absl::OkStatus();
  const tls::TlsIdentity& id = *options_.tls;
  error_code ec;
  tls_.emplace(asio::ssl::context::tls_server);
  tls_->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                        asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                        asio::ssl::context::no_tlsv1_1,
                    ec);
  if (!ec) tls_->use_certificate_chain(asio::buffer(id.cert_pem), ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("https: certificate file ", id.files.cert_file, ": ", ec.message()));
  }
  tls_->use_private_key(asio::buffer(id.key_pem), asio::ssl::context::pem, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("https: private key file ", id.files.key_file, ": ", ec.message()));
  }
  if (!id.ca_pem.empty()) {
    tls_->add_certificate_authority(asio::buffer(id.ca_pem), ec);
    if (!ec) {
      tls_->set_verify_mode(asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert, ec);
    }
    // A client that resumes a session (HAProxy does, per server) is refused by OpenSSL with
    // "session id context uninitialized" unless the context names one: sessions verified here
    // may be resumed only here.
    static constexpr unsigned char kSessionContext[] = "duet-https";
    if (!ec && SSL_CTX_set_session_id_context(tls_->native_handle(), kSessionContext,
                                              sizeof(kSessionContext) - 1) != 1) {
      ec = error_code(static_cast<int>(::ERR_get_error()), asio::error::get_ssl_category());
    }
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("https: CA file ", id.files.ca_file, ": ", ec.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status HttpServer::Impl::Listen() {
  if (absl::Status s = SetUpTls(); !s.ok()) return s;
  error_code ec;
  const asio::ip::address addr = asio::ip::make_address(options_.host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("http: ", options_.host, " is not an IP address: ", ec.message()));
  }
  const tcp::endpoint ep(addr, static_cast<uint16_t>(options_.port));
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("http: cannot bind ", options_.host, ":", options_.port, ": ", ec.message()));
  }
  port_ = acceptor_.local_endpoint().port();
  Accept();
  const int n = std::max(1, options_.io_threads);
  {
    absl::MutexLock lock(&threads_mu_);
    running_threads_ = n;
  }
  for (int i = 0; i < n; ++i) {
    threads_.emplace_back([this] {
      ioc_.run();
      absl::MutexLock lock(&threads_mu_);
      --running_threads_;
    });
  }
  return absl::OkStatus();
}

void HttpServer::Impl::Accept() {
  acceptor_.async_accept(asio::make_strand(ioc_), [this](error_code ec, tcp::socket socket) {
    if (stopping_.load() || !acceptor_.is_open()) return;
    if (ec) {
      // Out of descriptors (or another transient failure): try again shortly, not in a loop.
      DUET_LOG(WARNING) << "http: accept failed: " << ec.message();
      retry_timer_.expires_after(std::chrono::milliseconds(100));
      retry_timer_.async_wait([this](error_code e) {
        if (!e) Accept();
      });
      return;
    }
    error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    if (connections_.load() >= options_.max_connections) {
      Refuse(std::move(socket));
    } else {
      auto s = std::make_shared<Session>(std::move(socket), this);
      Register(s.get(), s);
      s->Post([s] { s->Start(); });
    }
    Accept();
  });
}

// Over the connection limit: a 503 naming it, then a lingering close (Refusal).
void HttpServer::Impl::Refuse(tcp::socket socket) {
  const std::string message = absl::StrCat(
      "the server holds its limit of ", options_.max_connections, " open connections; retry later");
  DUET_LOG(DEBUG) << "http: refusing a connection: " << message;
  const HttpErrorBody e = ErrorBody(503, "too_many_connections", message);
  std::string out =
      absl::StrCat(StatusLine(503), "Retry-After: 1\r\nContent-Type: ", e.content_type,
                   "\r\nConnection: close\r\nContent-Length: ", e.body.size(), "\r\n\r\n", e.body);
  Log("other", 503);
  std::make_shared<Refusal>(std::move(socket), tls(), std::move(out))->Start();
}

void HttpServer::Impl::Stop() {
  if (stopping_.exchange(true)) return;
  asio::post(acceptor_.get_executor(), [this] {
    error_code ignored;
    acceptor_.close(ignored);
    retry_timer_.cancel();
  });
  std::vector<std::shared_ptr<Session>> open;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [p, w] : sessions_) {
      if (std::shared_ptr<Session> s = w.lock()) open.push_back(std::move(s));
    }
  }
  for (std::shared_ptr<Session>& s : open) {
    s->gone_.store(true);
    s->Post([s] { s->Close("the server is stopping"); });
  }
  open.clear();
  // The loop ends by itself once every connection is closed; past the deadline it is stopped.
  {
    absl::MutexLock lock(&threads_mu_);
    threads_mu_.AwaitWithTimeout(absl::Condition(
                                     +[](int* n) { return *n == 0; }, &running_threads_),
                                 absl::Seconds(5));
  }
  ioc_.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { Stop(); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler handler,
                                                              HttpResponseLogger logger,
                                                              HttpErrorFormatter error_body) {
  if (options.write_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("http: write_timeout must be positive, not ",
                                                   absl::FormatDuration(options.write_timeout)));
  }
  auto impl =
      std::make_unique<Impl>(options, std::move(handler), std::move(logger), std::move(error_body));
  if (absl::Status s = impl->Listen(); !s.ok()) return s;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->port_; }
int HttpServer::connections() const { return impl_->connections_.load(); }
void HttpServer::Stop() {
  if (impl_) impl_->Stop();
}

}  // namespace duet::http
