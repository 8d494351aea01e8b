#include "cluster/etcd/etcd_watch.h"

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cluster/etcd/etcd_connection.h"
#include "cluster/etcd/etcd_http.h"
#include "cluster/etcd/etcd_json.h"

namespace duet::etcd {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// The bytes of an HTTP error body kept for its message.
constexpr size_t kMaxErrorBody = 64 << 10;

}  // namespace

// The state of one watch. Members marked "io thread" are touched only by the watch's thread
// (inside ioc_.run()); the rest is shared under mu_. Handlers capture `this`: the thread holds a
// shared_ptr until run() returns, and ioc_ (declared first) is destroyed last, dropping any
// handler that never ran.
class WatchStream {
 public:
  WatchStream(std::shared_ptr<EndpointSet> set, std::string key, std::string range_end,
              int64_t start_revision, absl::Time create_deadline, WatchCallback callback,
              WatchOptions options)
      : set_(std::move(set)),
        key_(std::move(key)),
        range_end_(std::move(range_end)),
        start_revision_(start_revision),
        create_deadline_(create_deadline),
        callback_(std::move(callback)),
        options_(options),
        first_(set_->preferred()),
        lines_(options.max_message_bytes) {}

  // The watch's thread: connects, then serves the stream until it fails or Stop().
  void Run() {
    Connect();
    ioc_.run();
  }

  // Waits until etcd created the watch (its endpoint) or it failed (the error).
  absl::StatusOr<std::string> AwaitCreated(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(this, &WatchStream::Settled), deadline);
    if (phase_ == Phase::kCreated) return endpoint_;
    if (phase_ == Phase::kFailed) return error_;
    phase_ = Phase::kFailed;
    return absl::DeadlineExceededError("etcd watch: not created by the call's deadline");
  }

  // Any thread: no callback starts after this (one running finishes); run() returns.
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopped_ = true;
    }
    ioc_.stop();
  }

 private:
  enum class Phase { kConnecting, kCreated, kFailed };

  bool Settled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return phase_ != Phase::kConnecting; }

  void Connect() {
    const std::vector<Endpoint>& endpoints = set_->endpoints();
    if (tried_ == endpoints.size()) {
      Fail(connect_error_);
      return;
    }
    const Endpoint& endpoint = endpoints[(first_ + tried_) % endpoints.size()];
    ++tried_;
    beast::error_code ec;
    const asio::ip::address address = asio::ip::make_address(endpoint.address, ec);
    if (ec) {
      Fail(absl::InvalidArgumentError(absl::StrCat("etcd at ", endpoint.url, ": bad address")));
      return;
    }
    // A connection per attempt: a TLS stream cannot be reused after a failed handshake.
    stream_ = std::make_unique<Connection>(ioc_, endpoint.tls ? set_->tls_context() : nullptr);
    stream_->ExpiresAt(
        SteadyTime(std::min(create_deadline_, absl::Now() + set_->limits().connect_timeout)));
    stream_->AsyncConnect(
        tcp::endpoint(address, endpoint.port), endpoint.host,
        [this, &endpoint](const beast::error_code& e) { OnConnect(endpoint, e); });
  }

  void OnConnect(const Endpoint& endpoint, const beast::error_code& ec) {
    if (failed_) return;
    if (ec) {
      connect_error_ = TransportError(endpoint.url, "connect", ec);
      stream_->Close();
      Connect();
      return;
    }
    stream_->ExpiresNever();
    url_ = endpoint.url;
    peer_ = stream_->socket().remote_endpoint(ignored_);
    peer_host_ = endpoint.host;
    tls_ = endpoint.tls;
    host_ = absl::StrCat(endpoint.host, ":", endpoint.port);
    // The whole request at once: etcd 3.4's gateway (Go 1.19's HTTP/1 server) holds back the
    // response until the request body has ended, so the request stream cannot stay open for
    // progress requests; after it ends the watch goes on.
    request_ =
        MakeRequest(host_, "/v3/watch", EncodeWatchCreate(key_, range_end_, start_revision_));
    stream_->Visit([this](auto& s) {
      http::async_write(s, request_,
                        [this](const beast::error_code& e, size_t) { OnRequestWritten(e); });
    });
    ArmTicker();
  }

  static http::request<http::string_body> MakeRequest(const std::string& host,
                                                      const std::string& path, std::string body) {
    http::request<http::string_body> request{http::verb::post, path, 11};
    request.set(http::field::host, host);
    request.set(http::field::content_type, "application/json");
    request.set(http::field::user_agent, "duet-etcd");
    request.body() = std::move(body);
    request.prepare_payload();
    return request;
  }

  void OnRequestWritten(const beast::error_code& ec) {
    if (failed_) return;
    if (ec) {
      Fail(TransportError(url_, "send", ec));
      return;
    }
    parser_.body_limit(boost::none);  // the stream is as long as the watch
    stream_->Visit([this](auto& s) {
      http::async_read_header(s, buffer_, parser_,
                              [this](const beast::error_code& e, size_t) { OnResponseHeader(e); });
    });
  }

  void OnResponseHeader(const beast::error_code& ec) {
    if (failed_) return;
    if (ec) {
      Fail(TransportError(url_, "reply", ec));
      return;
    }
    http_status_ = static_cast<int>(parser_.get().result_int());
    ReadMore();
  }

  void ReadMore() {
    stream_->Visit([this](auto& s) {
      http::async_read_some(s, buffer_, parser_,
                            [this](const beast::error_code& e, size_t) { OnRead(e); });
    });
  }

  void OnRead(const beast::error_code& ec) {
    if (failed_) return;
    std::string& body = parser_.get().body();
    if (http_status_ != 200) {  // an error answer: its body, then the error
      error_body_.append(body, 0, kMaxErrorBody - std::min(kMaxErrorBody, error_body_.size()));
      body.clear();
      if (ec || parser_.is_done() || error_body_.size() >= kMaxErrorBody) {
        Fail(DecodeError(http_status_, error_body_, url_));
      } else {
        ReadMore();
      }
      return;
    }
    lines_.Append(body);
    body.clear();
    while (std::optional<std::string> line = lines_.Next()) {
      HandleLine(*line);
      if (failed_) return;
    }
    if (lines_.overflowed()) {
      Fail(WithErrorCause(
          absl::ResourceExhaustedError(absl::StrCat("etcd at ", url_, ": a watch message exceeds ",
                                                    options_.max_message_bytes, " bytes")),
          ErrorCause{.endpoint = url_, .http_status = http_status_}));
    } else if (ec) {
      Fail(TransportError(url_, "watch stream broke", ec));
    } else if (parser_.is_done()) {
      Fail(WithErrorCause(
          absl::UnavailableError(absl::StrCat("etcd at ", url_, ": the watch stream ended")),
          ErrorCause{.endpoint = url_, .http_status = http_status_}));
    } else {
      ReadMore();
    }
  }

  void HandleLine(const std::string& line) {
    absl::StatusOr<WatchResponse> response = DecodeWatchLine(line, url_);
    if (!response.ok()) {
      Fail(response.status());
      return;
    }
    if (response->created) {
      absl::MutexLock lock(&mu_);
      if (phase_ == Phase::kConnecting) {
        phase_ = Phase::kCreated;
        endpoint_ = url_;
      }
    }
    for (WatchEvent& event : response->events) {
      {
        absl::MutexLock lock(&mu_);
        if (stopped_) return;
      }
      callback_(std::move(event));
    }
    if (!response->canceled) return;
    const ErrorCause cause{.endpoint = url_,
                           .http_status = http_status_,
                           .compact_revision = response->compact_revision};
    if (response->compact_revision > 0) {
      Fail(WithErrorCause(absl::OutOfRangeError(absl::StrCat(
                              "etcd at ", url_, ": the watch from revision ", start_revision_,
                              " needs compacted history; the oldest revision left is ",
                              response->compact_revision)),
                          cause));
    } else {
      Fail(WithErrorCause(absl::AbortedError(absl::StrCat(
                              "etcd at ", url_, " cancelled the watch: ", response->cancel_reason)),
                          cause));
    }
  }

  void ArmTicker() {
    ticker_.expires_after(
        absl::ToChronoNanoseconds(std::max(options_.probe_interval, absl::Milliseconds(1))));
    ticker_.async_wait([this](const beast::error_code& e) { OnTick(e); });
  }

  void OnTick(const beast::error_code& ec) {
    if (failed_ || ec) return;
    bool created;
    {
      absl::MutexLock lock(&mu_);
      created = phase_ == Phase::kCreated;
    }
    if (!created && absl::Now() >= create_deadline_) {
      Fail(WithErrorCause(absl::DeadlineExceededError(absl::StrCat(
                              "etcd at ", url_, ": the watch was not created by its deadline")),
                          ErrorCause{.endpoint = url_, .http_status = http_status_}));
      return;
    }
    if (created && !probing_) StartProbe();
    ArmTicker();
  }

  // The liveness probe: a one-key range read on a connection of its own to the same member,
  // which must answer within probe_timeout. A quiet watch has nothing to read for as long as
  // its keys do not change, so only this notices a member that hangs or is cut off.
  struct Probe {
    Probe(asio::io_context& ioc, asio::ssl::context* tls) : stream(ioc, tls) {}
    Connection stream;
    http::request<http::string_body> request;
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
  };

  void StartProbe() {
    // The last probe, finished, is destroyed here rather than inside its own handler.
    probe_ = std::make_unique<Probe>(ioc_, tls_ ? set_->tls_context() : nullptr);
    probing_ = true;
    probe_->request = MakeRequest(host_, "/v3/kv/range", EncodeRange(key_, ""));
    probe_->stream.ExpiresAfter(absl::ToChronoNanoseconds(options_.probe_timeout));
    probe_->stream.AsyncConnect(peer_, peer_host_,
                                [this](const beast::error_code& e) { OnProbeConnected(e); });
  }

  void OnProbeConnected(const beast::error_code& ec) {
    if (failed_) return;
    if (ec) {
      ProbeFailed("connect", ec);
      return;
    }
    probe_->stream.Visit([this](auto& s) {
      http::async_write(s, probe_->request,
                        [this](const beast::error_code& e, size_t) { OnProbeSent(e); });
    });
  }

  void OnProbeSent(const beast::error_code& ec) {
    if (failed_) return;
    if (ec) {
      ProbeFailed("send", ec);
      return;
    }
    probe_->stream.Visit([this](auto& s) {
      http::async_read(s, probe_->buffer, probe_->parser,
                       [this](const beast::error_code& e, size_t) { OnProbeReply(e); });
    });
  }

  void OnProbeReply(const beast::error_code& ec) {
    if (failed_) return;
    if (ec) {
      ProbeFailed("reply", ec);
      return;
    }
    absl::StatusOr<nlohmann::json> reply = ParseReply(
        static_cast<int>(probe_->parser.get().result_int()), probe_->parser.get().body(), url_);
    if (!reply.ok()) {
      Fail(reply.status());
      return;
    }
    probe_->stream.Close();
    probing_ = false;
  }

  void ProbeFailed(absl::string_view stage, const beast::error_code& ec) {
    const bool late = ec == beast::error::timeout;
    Fail(WithErrorCause(
        absl::Status(
            late ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable,
            absl::StrCat("etcd at ", url_, " serving the watch failed its liveness probe (", stage,
                         ": ", DescribeError(ec), late ? ", after " : "",
                         late ? absl::FormatDuration(options_.probe_timeout) : "", ")")),
        ErrorCause{.endpoint = url_}));
  }

  static absl::Status TransportError(const std::string& url, absl::string_view stage,
                                     const beast::error_code& ec) {
    return WithErrorCause(
        absl::UnavailableError(absl::StrCat("etcd at ", url, ": ", stage, ": ", DescribeError(ec))),
        ErrorCause{.endpoint = url});
  }

  // Ends the watch: closes the connection and reports `status`, to the callback once the watch
  // was created, else to AwaitCreated.
  void Fail(absl::Status status) {
    if (failed_) return;
    failed_ = true;
    if (stream_ != nullptr) stream_->Close();
    ticker_.cancel();
    if (probe_ != nullptr) probe_->stream.Close();
    bool report = false;
    {
      absl::MutexLock lock(&mu_);
      if (phase_ == Phase::kConnecting) error_ = status;
      report = phase_ == Phase::kCreated && !stopped_;
      phase_ = Phase::kFailed;
    }
    if (report) callback_(std::move(status));
  }

  asio::io_context ioc_{1};  // first: destroyed last

  const std::shared_ptr<EndpointSet> set_;
  const std::string key_;
  const std::string range_end_;
  const int64_t start_revision_;
  const absl::Time create_deadline_;
  WatchCallback callback_;  // io thread
  const WatchOptions options_;
  const size_t first_;  // the endpoint tried first

  // io thread:
  std::unique_ptr<Connection> stream_;  // the member's; one per connect attempt
  asio::steady_timer ticker_{ioc_};
  size_t tried_ = 0;
  absl::Status connect_error_ = absl::UnavailableError("etcd watch: no endpoint");
  beast::error_code ignored_;
  std::string url_;     // the endpoint connected to
  std::string host_;    // its Host header
  tcp::endpoint peer_;  // its address, for the probes
  std::string peer_host_;  // its host, for the probes' certificate check
  bool tls_ = false;       // the probes use TLS too
  http::request<http::string_body> request_;
  beast::flat_buffer buffer_;
  http::response_parser<http::string_body> parser_;
  int http_status_ = 0;
  std::string error_body_;
  LineSplitter lines_;
  std::unique_ptr<Probe> probe_;  // the last probe
  bool probing_ = false;          // probe_ is in flight
  bool failed_ = false;

  absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kConnecting;
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // the failure before the watch was created
  std::string endpoint_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

absl::StatusOr<std::unique_ptr<WatchHandle>> WatchHandle::Start(
    std::shared_ptr<EndpointSet> set, std::string key, std::string range_end,
    int64_t start_revision, absl::Time create_deadline, WatchCallback callback,
    WatchOptions options) {
  if (options.probe_interval <= absl::ZeroDuration() ||
      options.probe_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("etcd watch: probe_interval and probe_timeout must be > 0");
  }
  auto stream =
      std::make_shared<WatchStream>(std::move(set), std::move(key), std::move(range_end),
                                    start_revision, create_deadline, std::move(callback), options);
  std::thread thread([stream] { stream->Run(); });
  // A little past the deadline, so that the stream's own, more precise error wins.
  absl::StatusOr<std::string> endpoint =
      stream->AwaitCreated(create_deadline + absl::Milliseconds(250));
  if (!endpoint.ok()) {
    stream->Stop();
    thread.join();
    return endpoint.status();
  }
  return std::unique_ptr<WatchHandle>(
      new WatchHandle(std::move(stream), std::move(thread), *std::move(endpoint)));
}

WatchHandle::WatchHandle(std::shared_ptr<WatchStream> stream, std::thread thread,
                         std::string endpoint)
    : stream_(std::move(stream)), thread_(std::move(thread)), endpoint_(std::move(endpoint)) {}

WatchHandle::~WatchHandle() {
  stream_->Stop();
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // destroyed from its own callback: the thread ends when it returns
  } else {
    thread_.join();
  }
}

}  // namespace duet::etcd
