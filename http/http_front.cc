#include "http/http_front.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "http/openai_protocol.h"

namespace duet::http {
namespace {

using nlohmann::json;

constexpr char kJson[] = "application/json";

// One generation on its own thread; the HTTP side drains its responses from a queue, and
// Cancel() (or destruction) makes the backend end the request and free its blocks.
class RunningRequest {
 public:
  RunningRequest(GenerationBackend* backend, v1::GenerateRequest req) {
    thread_ = std::thread([this, backend, req = std::move(req)] {
      GenerateSink sink;
      sink.write = [this](const v1::GenerateResponse& r) {
        if (cancelled_.load()) return false;
        {
          std::lock_guard<std::mutex> lock(mu_);
          queue_.push_back(r);
        }
        cv_.notify_all();
        return true;
      };
      sink.cancelled = [this] { return cancelled_.load(); };
      sink.satisfied = [this] { return satisfied_.load(); };
      absl::Status s = backend->GenerateTo(req, sink);
      {
        std::lock_guard<std::mutex> lock(mu_);
        status_ = std::move(s);
        ended_ = true;
      }
      cv_.notify_all();
    });
  }
  ~RunningRequest() {
    Cancel();
    thread_.join();
  }
  void Cancel() { cancelled_.store(true); }
  // Ends the request because the front has what it asked for (a stop string).
  void EndSatisfied() {
    satisfied_.store(true);
    cancelled_.store(true);
  }
  bool cancelled() const { return cancelled_.load(); }
  // Moves queued responses to *out, waiting up to `timeout` for one; true once the request has
  // ended and everything it produced has been taken.
  bool Next(std::vector<v1::GenerateResponse>* out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !queue_.empty() || ended_; });
    while (!queue_.empty()) {
      out->push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    return ended_;
  }
  absl::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::GenerateResponse> queue_;
  bool ended_ = false;
  absl::Status status_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> satisfied_{false};
  std::thread thread_;  // last: started once the members it uses exist
};

// Turns GenerateResponses into OpenAI text, logprobs and a finish reason.
class ResponseBuilder {
 public:
  ResponseBuilder(const ParsedRequest& req, const model::Tokenizer* tok)
      : req_(req), tok_(tok), text_(req.stop) {}

  // Consumes one response; returns the text that may be sent now and, when logprobs were
  // asked for, this token's entry in *lp.
  std::string Consume(const v1::GenerateResponse& r, std::vector<TokenOut>* lp) {
    std::string piece;
    if (r.has_token() && !text_.stopped()) {
      ++completion_tokens_;
      const std::string bytes = TokenText(r.token_id());
      piece = text_.Add(bytes);
      if (req_.logprobs) {
        TokenOut t{.id = r.token_id(), .text = bytes, .logprob = r.logprob()};
        for (const v1::TopLogprob& top : r.top_logprobs()) {
          t.top.emplace_back(TokenText(top.token_id()), top.logprob());
        }
        lp->push_back(std::move(t));
      }
    }
    if (r.prompt_tokens() > 0) prompt_tokens_ = r.prompt_tokens();
    if (r.has_timings()) cached_tokens_ = r.timings().prefill_cached_tokens();
    if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      finish_reason_ = FinishReasonText(r.finish_reason());
    }
    if (text_.stopped()) finish_reason_ = "stop";
    full_text_ += piece;
    return piece;
  }
  std::string Finish() {
    std::string rest = text_.Finish();
    full_text_ += rest;
    return rest;
  }
  bool stopped() const { return text_.stopped(); }
  const std::string& finish_reason() const { return finish_reason_; }
  const std::string& full_text() const { return full_text_; }
  Usage usage(int64_t prompt_tokens) const {
    return Usage{.prompt_tokens = prompt_tokens_ > 0 ? prompt_tokens_ : prompt_tokens,
                 .completion_tokens = completion_tokens_,
                 .cached_tokens = cached_tokens_};
  }

 private:
  std::string TokenText(int32_t id) const {
    if (tok_->IsControl(id)) return "";
    auto s = tok_->Decode({id});
    return s.ok() ? *s : "";
  }

  const ParsedRequest& req_;
  const model::Tokenizer* tok_;
  TextAssembler text_;
  int64_t completion_tokens_ = 0;
  int64_t prompt_tokens_ = 0;
  int64_t cached_tokens_ = 0;
  std::string finish_reason_;
  std::string full_text_;
};

}  // namespace

class HttpFront::Handlers {
 public:
  Handlers(const HttpFrontOptions& options, GenerationBackend* backend,
           const model::Tokenizer* tokenizer, metrics::Registry* registry)
      : options_(options),
        backend_(backend),
        tokenizer_(tokenizer),
        registry_(registry),
        http_requests_(registry->AddCounter("duet_http_requests_total",
                                            "HTTP API requests by path and status code",
                                            {"path", "code"})),
        streams_(registry
                     ->AddGauge("duet_http_active_generations",
                                "Generation requests in flight on the HTTP API", {})
                     .WithLabels({})),
        disconnects_(registry
                         ->AddCounter("duet_http_client_disconnects_total",
                                      "Streams whose client went away before the end", {})
                         .WithLabels({})) {
    std::random_device rd;
    id_prefix_ = absl::StrCat(absl::Hex(rd() & 0xffffff));
  }

  void Install(httplib::Server& s) {
    s.set_payload_max_length(options_.max_body_bytes);
    s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!options_.api_key.empty() && absl::StartsWith(req.path, "/v1/") &&
          req.get_header_value("Authorization") != "Bearer " + options_.api_key) {
        ApiError e{.http_status = 401,
                   .type = "authentication_error",
                   .message = "a valid API key is required (Authorization: Bearer KEY)",
                   .code = "invalid_api_key"};
        Reply(res, e);
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      ApiError e{.http_status = res.status};
      if (res.status == 404) {
        e.message = absl::StrCat("no route for ", req.method, " ", req.path);
        e.code = "not_found";
      } else if (res.status == 413) {
        e.message = "the request body is larger than the server accepts";
        e.code = "body_too_large";
      } else {
        e.message = absl::StrCat("HTTP ", res.status);
      }
      res.set_content(ErrorBody(e), kJson);
    });
    s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      http_requests_.WithLabels({PathLabel(req.path), absl::StrCat(res.status)}).Increment();
    });
    s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      Generate(Endpoint::kCompletions, req, res);
    });
    s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      Generate(Endpoint::kChat, req, res);
    });
    s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json m = {{"id", options_.model_name},
                {"object", "model"},
                {"created", created_},
                {"owned_by", "duet"},
                {"max_model_len", options_.context_length}};
      res.set_content(Dump(json{{"object", "list"}, {"data", json::array({m})}}), kJson);
    });
    s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const v1::HealthResponse h = backend_->Health();
      json j = {{"status", h.ready() ? "ok" : "not_ready"},
                {"prefill_nodes", h.prefill_nodes()},
                {"decode_nodes", h.decode_nodes()},
                {"running_requests", h.running_requests()}};
      res.status = h.ready() ? 200 : 503;
      if (!h.ready()) res.set_header("Retry-After", "1");
      res.set_content(Dump(j), kJson);
    });
    s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(registry_->Render(), "text/plain; version=0.0.4; charset=utf-8");
    });
  }

  void Stop() { stopping_.store(true); }

 private:
  static std::string PathLabel(const std::string& path) {
    for (const char* p :
         {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"}) {
      if (path == p) return p;
    }
    return "other";
  }

  static void Reply(httplib::Response& res, const ApiError& e) {
    res.status = e.http_status;
    if (e.retry_after_s > 0) res.set_header("Retry-After", absl::StrCat(e.retry_after_s));
    res.set_content(ErrorBody(e), kJson);
  }

  // Holds one of the max_concurrent_streams slots while alive.
  struct Slot {
    explicit Slot(Handlers* h) : h(h) {}
    ~Slot() {
      h->active_.fetch_sub(1);
      h->streams_.Add(-1);
    }
    Handlers* h;
  };

  void Generate(Endpoint endpoint, const httplib::Request& hreq, httplib::Response& res) {
    auto parsed = std::make_shared<ParsedRequest>();
    if (std::optional<ApiError> e = ParseRequest(endpoint, hreq.body, parsed.get())) {
      return Reply(res, *e);
    }
    // ---- The prompt as token ids, checked against the vocabulary and the context.
    std::vector<int32_t> ids;
    if (endpoint == Endpoint::kCompletions && parsed->prompt_is_ids) {
      ids = parsed->prompt_ids;
      const int32_t vocab =
          options_.vocab_size > 0 ? options_.vocab_size : tokenizer_->vocab_size();
      for (int32_t id : ids) {
        if (id >= vocab) {
          return Reply(res, ApiError{.message = absl::StrCat(
                                         "token id ", id, " is outside the vocabulary of ", vocab),
                                     .param = "prompt",
                                     .code = "invalid_value"});
        }
      }
    } else {
      std::string text = parsed->prompt;
      if (endpoint == Endpoint::kChat) {
        absl::StatusOr<std::string> chat =
            model::RenderChat(model::ChatTemplateOf(*tokenizer_), parsed->messages);
        if (!chat.ok()) return Reply(res, ErrorFromStatus(chat.status()));
        text = *std::move(chat);
      }
      absl::StatusOr<std::vector<int32_t>> enc = tokenizer_->Encode(text, /*add_bos=*/true);
      if (!enc.ok()) return Reply(res, ErrorFromStatus(enc.status()));
      ids = *std::move(enc);
    }
    if (std::optional<ApiError> e =
            CheckLengths(parsed.get(), static_cast<int64_t>(ids.size()), options_.context_length)) {
      return Reply(res, *e);
    }
    // ---- Admission: a bounded number of generations in flight.
    if (active_.fetch_add(1) >= options_.max_concurrent_streams) {
      active_.fetch_sub(1);
      return Reply(res, ApiError{.http_status = 429,
                                 .type = "rate_limit_error",
                                 .message = absl::StrCat("too many concurrent requests (limit ",
                                                         options_.max_concurrent_streams, ")"),
                                 .code = "too_many_requests",
                                 .retry_after_s = 1});
    }
    streams_.Add(1);
    auto slot = std::make_shared<Slot>(this);

    v1::GenerateRequest greq;
    const std::string id = absl::StrCat(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-",
                                        id_prefix_, "-", next_id_.fetch_add(1));
    greq.set_request_id(id);
    greq.mutable_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
    *greq.mutable_sampling() = ToSampling(*parsed);
    auto run = std::make_shared<RunningRequest>(backend_, std::move(greq));

    // Wait for the first response or the end: failures before any token get a real status.
    std::vector<v1::GenerateResponse> first;
    bool ended = false;
    while (first.empty() && !ended) {
      ended = run->Next(&first, std::chrono::milliseconds(100));
      if (stopping_.load()) run->Cancel();
    }
    if (first.empty()) {
      absl::Status s = run->status();
      if (s.ok()) s = absl::InternalError("the request ended without a response");
      return Reply(res, ErrorFromStatus(s));
    }
    const int64_t created = absl::ToUnixSeconds(absl::Now());
    const int64_t prompt_tokens = static_cast<int64_t>(ids.size());
    auto builder = std::make_shared<ResponseBuilder>(*parsed, tokenizer_);

    if (!parsed->stream) {
      std::vector<TokenOut> lp;
      std::vector<v1::GenerateResponse> batch = std::move(first);
      while (true) {
        for (const v1::GenerateResponse& r : batch) builder->Consume(r, &lp);
        if (builder->stopped()) run->EndSatisfied();
        if (ended || builder->stopped()) break;
        batch.clear();
        ended = run->Next(&batch, std::chrono::milliseconds(100));
        if (stopping_.load()) run->Cancel();
      }
      builder->Finish();
      absl::Status s = run->status();
      if (!builder->stopped() && builder->finish_reason().empty()) {
        if (s.ok()) s = absl::InternalError("the request ended without a finish reason");
        return Reply(res, ErrorFromStatus(s));
      }
      json logprobs = parsed->logprobs ? LogprobsJson(endpoint, lp, 0) : json(nullptr);
      res.set_content(
          Dump(ResponseJson(endpoint, id, created, options_.model_name, builder->full_text(),
                            logprobs, builder->finish_reason(), builder->usage(prompt_tokens))),
          kJson);
      return;
    }

    // ---- Streaming: server-sent events until the finish reason, then [DONE].
    auto pending = std::make_shared<std::vector<v1::GenerateResponse>>(std::move(first));
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Request-Id", id);
    res.set_chunked_content_provider(
        "text/event-stream", [this, run, slot, parsed, builder, pending, id, created, prompt_tokens,
                              endpoint, ended](size_t, httplib::DataSink& sink) mutable {
          bool first_chunk = true;
          size_t text_offset = 0;
          auto last_write = std::chrono::steady_clock::now();
          auto send = [&](const json& j) {
            const std::string event = "data: " + Dump(j) + "\n\n";
            last_write = std::chrono::steady_clock::now();
            return sink.write(event.data(), event.size());
          };
          auto gone = [&] {
            run->Cancel();
            disconnects_.Increment();
            return false;
          };
          std::vector<v1::GenerateResponse> batch = std::move(*pending);
          while (true) {
            for (const v1::GenerateResponse& r : batch) {
              std::vector<TokenOut> lp;
              const std::string piece = builder->Consume(r, &lp);
              if (piece.empty() && lp.empty() && !first_chunk) continue;
              json logprobs =
                  parsed->logprobs ? LogprobsJson(endpoint, lp, text_offset) : json(nullptr);
              text_offset += piece.size();
              if (!send(ChunkJson(endpoint, id, created, options_.model_name, piece, first_chunk,
                                  logprobs, "", std::nullopt))) {
                return gone();
              }
              first_chunk = false;
            }
            if (builder->stopped()) run->EndSatisfied();
            if (ended || builder->stopped()) break;
            batch.clear();
            ended = run->Next(&batch, std::chrono::milliseconds(500));
            if (stopping_.load()) {
              run->Cancel();
              return false;
            }
            // A stream without new text (idle, or tokens that hold no text yet) still finds
            // out that its client has gone.
            if (!ended && std::chrono::steady_clock::now() - last_write > std::chrono::seconds(1)) {
              last_write = std::chrono::steady_clock::now();
              static constexpr char kPing[] = ": ping\n\n";
              if (!sink.is_writable() || !sink.write(kPing, sizeof(kPing) - 1)) return gone();
            }
          }
          const std::string rest = builder->Finish();
          if (!builder->stopped() && builder->finish_reason().empty()) {
            absl::Status s = run->status();
            if (s.ok()) s = absl::InternalError("the request ended without a finish reason");
            const std::string event = "data: " + ErrorBody(ErrorFromStatus(s)) + "\n\n";
            sink.write(event.data(), event.size());
          } else {
            std::optional<Usage> usage;
            if (parsed->include_usage) usage = builder->usage(prompt_tokens);
            json logprobs =
                parsed->logprobs ? LogprobsJson(endpoint, {}, text_offset) : json(nullptr);
            if (!send(ChunkJson(endpoint, id, created, options_.model_name, rest, first_chunk,
                                logprobs, builder->finish_reason(), usage))) {
              return gone();
            }
          }
          static constexpr char kDone[] = "data: [DONE]\n\n";
          sink.write(kDone, sizeof(kDone) - 1);
          sink.done();
          return true;
        });
  }

  const HttpFrontOptions options_;
  GenerationBackend* const backend_;
  const model::Tokenizer* const tokenizer_;
  metrics::Registry* const registry_;
  metrics::Family<metrics::Counter>& http_requests_;
  metrics::Gauge& streams_;
  metrics::Counter& disconnects_;
  const int64_t created_ = absl::ToUnixSeconds(absl::Now());
  std::string id_prefix_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int> active_{0};
  std::atomic<bool> stopping_{false};
};

absl::StatusOr<std::unique_ptr<HttpFront>> HttpFront::Start(const HttpFrontOptions& options,
                                                            GenerationBackend* backend,
                                                            const model::Tokenizer* tokenizer,
                                                            metrics::Registry* registry) {
  std::unique_ptr<HttpFront> f(new HttpFront());
  f->handlers_ = std::make_unique<Handlers>(options, backend, tokenizer, registry);
  f->server_ = std::make_unique<httplib::Server>();
  const int threads = std::max(4, options.max_concurrent_streams + 4);
  f->server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  f->handlers_->Install(*f->server_);
  if (options.port == 0) {
    f->port_ = f->server_->bind_to_any_port(options.host);
  } else {
    f->port_ = f->server_->bind_to_port(options.host, options.port) ? options.port : -1;
  }
  if (f->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrCat("http: cannot bind ", options.host, ":", options.port));
  }
  httplib::Server* s = f->server_.get();
  f->thread_ = std::thread([s] { s->listen_after_bind(); });
  while (!s->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return f;
}

HttpFront::~HttpFront() { Stop(); }

void HttpFront::Stop() {
  if (handlers_) handlers_->Stop();
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string ModelNameFromPath(std::string model_path) {
  while (!model_path.empty() && model_path.back() == '/') model_path.pop_back();
  return model_path.substr(model_path.rfind('/') + 1);
}

}  // namespace duet::http
