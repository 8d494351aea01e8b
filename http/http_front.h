// HttpFront: the OpenAI-compatible HTTP API of every process that serves clients: the
// coordinator and the colocated server. It runs on HttpServer (http/http_server.h, event-driven:
// slow and idle clients hold no thread; header, body and idle deadlines; a connection limit).
//   POST /v1/completions, POST /v1/chat/completions (stream: true -> server-sent events),
//   GET /v1/models and /v1/models/{id}, GET /health (200 only when the backend can prefill and
//   decode) and GET|POST /ping (the same status, no body), GET /metrics (Prometheus text from
//   the server's registry), GET /metrics/targets (Prometheus HTTP service discovery: this server
//   and every live node's /metrics, with labels; http/metrics_targets.h), GET /version,
//   POST /tokenize and /detokenize (vLLM's shapes; on a thread of their own), and CORS
//   preflights (OPTIONS; cors.h).
// It parses, checks and runs each request in-process through a GenerationBackend (the
// coordinator's request path, or the colocated server's) on a thread of its own, at most
// max_concurrent_streams generations at once (429 beyond, before any thread is started), maps
// failures to OpenAI-shaped errors (429/503 with Retry-After when there is no capacity), and
// cancels a request whose client disconnects or stops reading (write_timeout), streamed or not.
// /health, /ping, /metrics, /metrics/targets and /v1/models are answered on the I/O threads and
// never wait for a generation. With an API key every route but /health, /ping, /metrics,
// /metrics/targets, /version and preflights needs it. Every response to a request from an
// allowed Origin carries the CORS headers, and one to a request with an X-Request-Id header
// echoes it.
//
//   HttpFrontOptions o{.host = "127.0.0.1", .port = 8000, .model_name = "smollm2"};
//   DUET_ASSIGN_OR_RETURN(auto front, HttpFront::Start(o, backend, tokenizer, &registry));
//   // curl http://127.0.0.1:8000/v1/completions -d '{"prompt": "Hi", "max_tokens": 8}'
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "common/tokenizer/tokenizer.h"
#include "duet/v1/client.pb.h"
#include "http/cors.h"
#include "http/http_server.h"
#include "http/tool_calls.h"

namespace duet::http {

// Where one request's responses go.
struct GenerateSink {
  std::function<bool(const v1::GenerateResponse&)> write;  // false: stop, the client is gone
  std::function<bool()> cancelled;                         // polled while waiting for tokens
  // Optional. True when the caller stopped the request because it has all it asked for (a
  // `stop` string matched): the request ends as a cancelled one does, but it counts, and
  // returns, as finished (OkStatus).
  std::function<bool()> satisfied;
  // Optional. Where the request stands in the engine, as vLLM's scheduler counts it: true once a
  // scheduler takes it into a batch (its prefill starts: P's, or the colocated server's), false
  // when it goes back to waiting (preempted, or re-routed to a new attempt). On the caller's
  // thread of GenerateTo, before any write of the same request that follows it.
  std::function<void(bool running)> scheduled;
};

// The request path the front drives (the coordinator and the colocated server implement it).
class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  // Runs one request to its end; returns the terminal status.
  virtual absl::Status GenerateTo(const v1::GenerateRequest& req, const GenerateSink& sink) = 0;
  virtual v1::HealthResponse Health() = 0;
};

struct HttpFrontOptions {
  std::string host = "127.0.0.1";
  int port = 0;         // 0: any free port
  std::string api_key;  // non-empty: require "Authorization: Bearer <api_key>"
  size_t max_body_bytes = 1 << 20;
  int max_concurrent_streams = 64;  // generation requests in flight (streamed or not)
  // Open connections, idle or not (beyond: 503). Separate from max_concurrent_streams: a
  // connection costs a socket, not a thread. Mind RLIMIT_NOFILE.
  int max_connections = 2048;
  absl::Duration header_timeout = absl::Seconds(10);  // accept (or first byte) to header's end
  absl::Duration body_timeout = absl::Seconds(30);    // header's end to body's end
  absl::Duration idle_timeout = absl::Seconds(30);    // a kept-alive connection between requests
  // Progress deadline of a response: a client that has taken none of its pending bytes for this
  // long (it does not read; the socket's buffers are full) is cut off, and its request
  // cancelled as for a disconnect (slot, generation and KV freed). Must be positive.
  absl::Duration write_timeout = absl::Seconds(30);
  int io_threads = 2;                                 // the event loop's threads
  // How much lower than the event loop the generation threads run (nice; 0: the same), so that
  // /health, accepts and deadlines are served first when every generation wakes at once.
  int generation_nice = 5;
  // The names this server answers to (vLLM's --served-model-name): /v1/models lists each, and a
  // request whose "model" is none of them is a 404 model_not_found. Empty: {model_name}, which
  // the servers set from the model's path.
  std::vector<std::string> served_model_names;
  std::string model_name = "duet";
  // The model's context; /v1/models and the length checks use the backend's max_model_len
  // (HealthResponse) when it reports one, capped by this.
  int64_t context_length = 2048;
  // The model's vocabulary (its embedding rows, which may exceed the tokenizer's entries); prompt
  // ids are checked against it. 0: the tokenizer's size.
  int32_t vocab_size = 0;
  // What this server is, for its own entry in GET /metrics/targets: "coordinator" or
  // "colocated".
  std::string server_kind = "coordinator";
  // HTTPS (HttpServerOptions::tls): nullopt serves plain HTTP.
  std::optional<tls::TlsIdentity> tls;
  // Browsers' cross-origin requests (cors.h): every origin by default, as vLLM.
  CorsOptions cors;
  // The chat template's source in place of the model's (vLLM's --chat-template); empty: the
  // model's. Like the model's, it is recognised by its family (chat_template.h), not run.
  std::string chat_template;
  // tool_choice auto (tool_calls.h): refused unless enabled with a parser, as vLLM.
  bool enable_auto_tool_choice = false;
  ToolCallParser tool_call_parser = ToolCallParser::kNone;
};

// The name /v1/models reports for a model at `model_path`: its last path component
// ("models/smollm2/" -> "smollm2").
std::string ModelNameFromPath(std::string model_path);

class HttpFront {
 public:
  // backend, tokenizer and registry must outlive the front.
  static absl::StatusOr<std::unique_ptr<HttpFront>> Start(const HttpFrontOptions& options,
                                                          GenerationBackend* backend,
                                                          const model::Tokenizer* tokenizer,
                                                          metrics::Registry* registry);
  ~HttpFront();
  HttpFront(const HttpFront&) = delete;
  HttpFront& operator=(const HttpFront&) = delete;

  int port() const { return port_; }
  // Stops accepting and ends open streams (their requests are cancelled). Idempotent.
  void Stop();

  class Handlers;  // http_front.cc

 private:
  HttpFront() = default;
  std::unique_ptr<Handlers>
      handlers_;  // routes and generation threads (joined before server_ stops)
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
};

}  // namespace duet::http
