#include "http/http_front.h"

#include <algorithm>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "http/generation_threads.h"
#include "http/openai_protocol.h"
#include "http/vllm_metrics.h"

namespace duet::http {
namespace {

using nlohmann::json;

constexpr char kJson[] = "application/json";

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

// One generation's state, shared by the backend's sink calls (the backend's thread) and the
// generation thread that ends the response once GenerateTo returns.
struct Generation {
  Endpoint endpoint;
  std::string model;  // the served name responses report: the request's, else the first
  std::shared_ptr<ParsedRequest> parsed;
  v1::GenerateRequest request;
  std::string id;
  int64_t prompt_tokens = 0;
  std::shared_ptr<HttpResponder> res;
  std::atomic<bool> cancelled{false};  // the front ended it: a stop string matched
  std::atomic<bool> satisfied{false};
  std::atomic<bool> client_gone{false};
  absl::Mutex mu;
  std::unique_ptr<ResponseBuilder> builder ABSL_GUARDED_BY(mu);
  bool responded ABSL_GUARDED_BY(mu) = false;  // a first response arrived (the head is sent)
  bool first_chunk ABSL_GUARDED_BY(mu) = true;
  size_t text_offset ABSL_GUARDED_BY(mu) = 0;
  int64_t created ABSL_GUARDED_BY(mu) = 0;
  std::vector<TokenOut> logprobs ABSL_GUARDED_BY(mu);  // not streamed: every token's
  std::optional<VllmMetrics::Request> vllm ABSL_GUARDED_BY(mu);   // the vllm:* series
  std::optional<v1::RequestTimings> timings ABSL_GUARDED_BY(mu);  // from the finishing response
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
                                      "Generation requests whose client went away before the end",
                                      {})
                         .WithLabels({})),
        vllm_(registry, ServedNames().front(), [backend] { return backend->Health(); }) {
    std::random_device rd;
    id_prefix_ = absl::StrCat(absl::Hex(rd() & 0xffffff));
  }

  // The longest request (prompt + max_tokens) served: the backend's max_model_len (what its
  // KV pools can hold for one request) when it knows one, capped by the model's context.
  int64_t MaxModelLen() {
    const int64_t served = backend_->Health().max_model_len();
    return served > 0 ? std::min(served, options_.context_length) : options_.context_length;
  }

  // On an I/O thread: quick routes are answered here, generations go to their own thread.
  void Handle(HttpRequest req, std::shared_ptr<HttpResponder> res) {
    if (!options_.api_key.empty() && absl::StartsWith(req.path, "/v1/") &&
        req.Header("Authorization") != "Bearer " + options_.api_key) {
      return Reply(*res,
                   ApiError{.http_status = 401,
                            .type = "authentication_error",
                            .message = "a valid API key is required (Authorization: Bearer KEY)",
                            .code = "invalid_api_key"});
    }
    if (req.method == "POST" && req.path == "/v1/completions") {
      return Spawn(Endpoint::kCompletions, std::move(req), std::move(res));
    }
    if (req.method == "POST" && req.path == "/v1/chat/completions") {
      return Spawn(Endpoint::kChat, std::move(req), std::move(res));
    }
    if (req.method == "POST" && (req.path == "/tokenize" || req.path == "/detokenize")) {
      // Tokenizing may take a while (a megabyte prompt): off the event loop.
      return threads_.Run([this, req = std::move(req), res = std::move(res)]() mutable {
        Reply(*res, req.path == "/tokenize" ? Tokenize(req.body) : Detokenize(req.body));
      });
    }
    const bool get = req.method == "GET" || req.method == "HEAD";
    if (get && req.path == "/v1/models") {
      json data = json::array();
      for (const std::string& name : ServedNames()) data.push_back(ModelCard(name));
      return res->Reply(200, {}, kJson, Dump(json{{"object", "list"}, {"data", data}}));
    }
    if (get && absl::StartsWith(req.path, "/v1/models/")) {
      const std::string id = req.path.substr(std::string("/v1/models/").size());
      if (std::optional<ApiError> e = CheckModel(id)) return Reply(*res, *e);
      return res->Reply(200, {}, kJson, Dump(ModelCard(id)));
    }
    if (get && req.path == "/version") {
      return res->Reply(200, {}, kJson, Dump(json{{"version", DUET_VERSION}}));
    }
    if (get && req.path == "/health") {
      const v1::HealthResponse h = backend_->Health();
      json j = {{"status", h.ready() ? "ok" : "not_ready"},
                {"prefill_nodes", h.prefill_nodes()},
                {"decode_nodes", h.decode_nodes()},
                {"running_requests", h.running_requests()}};
      HttpHeaders headers;
      if (!h.ready()) headers.emplace_back("Retry-After", "1");
      return res->Reply(h.ready() ? 200 : 503, headers, kJson, Dump(j));
    }
    if (get && req.path == "/metrics") {
      return res->Reply(200, {}, "text/plain; version=0.0.4; charset=utf-8", registry_->Render());
    }
    Reply(*res, ApiError{.http_status = 404,
                         .message = absl::StrCat("no route for ", req.method, " ", req.path),
                         .code = "not_found"});
  }

  // A JSON body answered 200, or an error.
  struct Answer {
    Answer(json j) : body(std::move(j)) {}       // NOLINT: implicit, as a return value
    Answer(ApiError e) : error(std::move(e)) {}  // NOLINT
    json body;
    std::optional<ApiError> error;
  };
  static void Reply(HttpResponder& res, const Answer& a) {
    if (a.error) return Reply(res, *a.error);
    res.Reply(200, {}, kJson, Dump(a.body));
  }

  std::vector<std::string> ServedNames() const {
    return options_.served_model_names.empty() ? std::vector<std::string>{options_.model_name}
                                               : options_.served_model_names;
  }

  // A 404 model_not_found (as OpenAI and vLLM answer) unless `name` is one this server serves.
  std::optional<ApiError> CheckModel(const std::string& name) const {
    const std::vector<std::string> names = ServedNames();
    if (std::find(names.begin(), names.end(), name) != names.end()) return std::nullopt;
    return ApiError{
        .http_status = 404,
        .message = absl::StrCat("the model '", name, "' does not exist; this server serves '",
                                absl::StrJoin(names, "', '"), "'"),
        .param = "model",
        .code = "model_not_found"};
  }

  json ModelCard(const std::string& name) {
    return {{"id", name},
            {"object", "model"},
            {"created", created_},
            {"owned_by", "duet"},
            {"max_model_len", MaxModelLen()}};
  }

  // POST /tokenize, as vLLM has it: {"prompt": "..."} or {"messages": [...]} (rendered with the
  // chat template) -> {"count", "max_model_len", "tokens"}: the ids a completion or chat request
  // with that body would be prefilled with.
  Answer Tokenize(const std::string& body) {
    const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      return ApiError{.message = "the request body must be a JSON object", .code = "invalid_json"};
    }
    bool add_special = true;
    if (auto it = j.find("add_special_tokens"); it != j.end() && !it->is_null()) {
      if (!it->is_boolean()) {
        return ApiError{.message = "'add_special_tokens' must be a boolean",
                        .param = "add_special_tokens",
                        .code = "invalid_type"};
      }
      add_special = it->get<bool>();
    }
    json stripped = j;
    stripped.erase("add_special_tokens");
    const Endpoint ep = j.contains("messages") ? Endpoint::kChat : Endpoint::kCompletions;
    ParsedRequest parsed;
    if (std::optional<ApiError> e = ParseRequest(ep, stripped.dump(), &parsed)) return *e;
    if (!parsed.model.empty()) {
      if (std::optional<ApiError> e = CheckModel(parsed.model)) return *e;
    }
    std::vector<int32_t> ids = parsed.prompt_ids;
    if (!parsed.prompt_is_ids) {
      std::string text = parsed.prompt;
      if (ep == Endpoint::kChat) {
        absl::StatusOr<std::string> chat =
            model::RenderChat(model::ChatTemplateOf(*tokenizer_), parsed.messages);
        if (!chat.ok()) return ErrorFromStatus(chat.status());
        text = *std::move(chat);
      }
      absl::StatusOr<std::vector<int32_t>> enc = tokenizer_->Encode(text, add_special);
      if (!enc.ok()) return ErrorFromStatus(enc.status());
      ids = *std::move(enc);
    }
    return json{{"count", ids.size()},
                {"max_model_len", MaxModelLen()},
                {"tokens", ids},
                {"token_strs", nullptr}};
  }

  // POST /detokenize, as vLLM has it: {"tokens": [...]} -> {"prompt": "..."}.
  Answer Detokenize(const std::string& body) {
    const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      return ApiError{.message = "the request body must be a JSON object", .code = "invalid_json"};
    }
    auto it = j.find("tokens");
    if (it == j.end() || !it->is_array()) {
      return ApiError{.message = "'tokens' must be an array of token ids",
                      .param = "tokens",
                      .code = "invalid_type"};
    }
    const int32_t vocab = options_.vocab_size > 0 ? options_.vocab_size : tokenizer_->vocab_size();
    std::vector<int32_t> ids;
    for (const json& t : *it) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab) {
        return ApiError{.message = absl::StrCat("'tokens' holds ", t.dump(),
                                                ", not a token id of the vocabulary of ", vocab),
                        .param = "tokens",
                        .code = "invalid_value"};
      }
      ids.push_back(t.get<int32_t>());
    }
    absl::StatusOr<std::string> text = tokenizer_->Decode(ids);
    if (!text.ok()) return ErrorFromStatus(text.status());
    return json{{"prompt", *text}};
  }

  // Counts a response for duet_http_requests_total.
  void Log(const std::string& path, int status) {
    http_requests_.WithLabels({PathLabel(path), absl::StrCat(status)}).Increment();
  }

  // The generations are told to end; waits for their threads.
  void Stop() {
    stopping_.store(true);
    threads_.JoinAll(absl::Seconds(30));
  }

 private:
  static std::string PathLabel(const std::string& path) {
    for (const char* p : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
                          "/metrics", "/tokenize", "/detokenize", "/version"}) {
      if (path == p) return p;
    }
    return "other";
  }

  static void Reply(HttpResponder& res, const ApiError& e) {
    HttpHeaders headers;
    if (e.retry_after_s > 0) headers.emplace_back("Retry-After", absl::StrCat(e.retry_after_s));
    res.Reply(e.http_status, headers, kJson, ErrorBody(e));
  }

  // Parsing and tokenizing (up to max_body_bytes of prompt) happen off the event loop too, on
  // the thread that then runs the generation; a request refused on the way (400, 429) ends it.
  void Spawn(Endpoint endpoint, HttpRequest req, std::shared_ptr<HttpResponder> res) {
    threads_.Run([this, endpoint, req = std::move(req), res = std::move(res)]() mutable {
      Generate(endpoint, req, std::move(res));
    });
  }

  // On a generation thread: checks, admission, then the generation itself.
  void Generate(Endpoint endpoint, const HttpRequest& hreq, std::shared_ptr<HttpResponder> res) {
    auto parsed = std::make_shared<ParsedRequest>();
    if (std::optional<ApiError> e = ParseRequest(endpoint, hreq.body, parsed.get())) {
      return Reply(*res, *e);
    }
    if (!parsed->model.empty()) {
      if (std::optional<ApiError> e = CheckModel(parsed->model)) return Reply(*res, *e);
    }
    // ---- The prompt as token ids, checked against the vocabulary and the context.
    std::vector<int32_t> ids;
    if (endpoint == Endpoint::kCompletions && parsed->prompt_is_ids) {
      ids = parsed->prompt_ids;
      const int32_t vocab =
          options_.vocab_size > 0 ? options_.vocab_size : tokenizer_->vocab_size();
      for (int32_t id : ids) {
        if (id >= vocab) {
          return Reply(*res, ApiError{.message = absl::StrCat(
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
        if (!chat.ok()) return Reply(*res, ErrorFromStatus(chat.status()));
        text = *std::move(chat);
      }
      absl::StatusOr<std::vector<int32_t>> enc = tokenizer_->Encode(text, /*add_bos=*/true);
      if (!enc.ok()) return Reply(*res, ErrorFromStatus(enc.status()));
      ids = *std::move(enc);
    }
    if (std::optional<ApiError> e =
            CheckLengths(parsed.get(), static_cast<int64_t>(ids.size()), MaxModelLen())) {
      return Reply(*res, *e);
    }
    // ---- Admission: a bounded number of generations in flight.
    if (stopping_.load()) {
      return Reply(*res, ApiError{.http_status = 503,
                                  .type = "server_error",
                                  .message = "the server is shutting down",
                                  .code = "shutting_down",
                                  .retry_after_s = 1});
    }
    if (active_.fetch_add(1) >= options_.max_concurrent_streams) {
      active_.fetch_sub(1);
      return Reply(*res, ApiError{.http_status = 429,
                                  .type = "rate_limit_error",
                                  .message = absl::StrCat("too many concurrent requests (limit ",
                                                          options_.max_concurrent_streams, ")"),
                                  .code = "too_many_requests",
                                  .retry_after_s = 1});
    }
    streams_.Add(1);

    auto g = std::make_shared<Generation>();
    g->endpoint = endpoint;
    g->model = parsed->model.empty() ? ServedNames().front() : parsed->model;
    g->id = absl::StrCat(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-", id_prefix_, "-",
                         next_id_.fetch_add(1));
    g->request.set_request_id(g->id);
    g->request.mutable_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
    *g->request.mutable_sampling() = ToSampling(*parsed);
    g->prompt_tokens = static_cast<int64_t>(ids.size());
    g->res = std::move(res);
    {
      absl::MutexLock lock(&g->mu);
      g->builder = std::make_unique<ResponseBuilder>(*parsed, tokenizer_);
      g->vllm.emplace(vllm_.Start());
    }
    g->parsed = std::move(parsed);
    Run(*g);
    active_.fetch_sub(1);
    streams_.Add(-1);
  }

  // True when the request must end: a stop string matched, the front stops, or the client has
  // gone (counted once).
  bool Ended(Generation& g) {
    if (g.res->gone() && !g.client_gone.exchange(true)) disconnects_.Increment();
    return g.cancelled.load() || stopping_.load() || g.client_gone.load();
  }

  // One response from the backend: the head on the first, then SSE events (streamed) or
  // accumulation (not streamed). False: stop producing.
  bool Write(Generation& g, const v1::GenerateResponse& r) {
    {
      // Every token the backend generated counts, also one that arrives after a stop string.
      absl::MutexLock lock(&g.mu);
      if (r.has_token()) g.vllm->OnToken(absl::Now());
      if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) g.timings = r.timings();
    }
    if (Ended(g)) return false;
    absl::MutexLock lock(&g.mu);
    ResponseBuilder& b = *g.builder;
    if (!g.responded) {
      g.responded = true;
      g.created = absl::ToUnixSeconds(absl::Now());
      if (g.parsed->stream) {
        g.res->StartChunked(200, {{"Cache-Control", "no-cache"}, {"X-Request-Id", g.id}},
                            "text/event-stream", ": ping\n\n");
      }
    }
    if (!g.parsed->stream) {
      b.Consume(r, &g.logprobs);
    } else {
      std::vector<TokenOut> lp;
      const std::string piece = b.Consume(r, &lp);
      if (!piece.empty() || !lp.empty() || g.first_chunk) {
        json logprobs =
            g.parsed->logprobs ? LogprobsJson(g.endpoint, lp, g.text_offset) : json(nullptr);
        g.text_offset += piece.size();
        if (!g.res->WriteChunk(Event(ChunkJson(g.endpoint, g.id, g.created, g.model, piece,
                                               g.first_chunk, logprobs, "", std::nullopt)))) {
          Ended(g);
          return false;
        }
        g.first_chunk = false;
      }
    }
    if (b.stopped()) {
      // The front has what it asked for: the request ends as satisfied.
      g.satisfied.store(true);
      g.cancelled.store(true);
    }
    return true;
  }

  static std::string Event(const json& j) { return "data: " + Dump(j) + "\n\n"; }

  // On the generation's thread: drives the backend, then ends the response.
  void Run(Generation& g) {
    GenerateSink sink;
    sink.write = [this, &g](const v1::GenerateResponse& r) { return Write(g, r); };
    sink.cancelled = [this, &g] { return Ended(g); };
    sink.satisfied = [&g] { return g.satisfied.load(); };
    absl::Status s = backend_->GenerateTo(g.request, sink);
    Ended(g);  // a client that left near the end is counted too
    absl::MutexLock lock(&g.mu);
    ResponseBuilder& b = *g.builder;
    if (g.client_gone.load() && !b.stopped()) return;  // nobody to answer
    if (!g.responded) {
      // Failures before any token get a real status.
      if (s.ok()) s = absl::InternalError("the request ended without a response");
      return Reply(*g.res, ErrorFromStatus(s));
    }
    const std::string rest = b.Finish();
    const bool finished = b.stopped() || !b.finish_reason().empty();
    g.vllm->Finish(g.prompt_tokens, finished ? b.finish_reason() : "abort",
                   g.timings ? &*g.timings : nullptr);
    if (!finished && s.ok()) s = absl::InternalError("the request ended without a finish reason");
    if (!g.parsed->stream) {
      if (!finished) return Reply(*g.res, ErrorFromStatus(s));
      json logprobs = g.parsed->logprobs ? LogprobsJson(g.endpoint, g.logprobs, 0) : json(nullptr);
      g.res->Reply(200, {}, kJson,
                   Dump(ResponseJson(g.endpoint, g.id, g.created, g.model, b.full_text(), logprobs,
                                     b.finish_reason(), b.usage(g.prompt_tokens))));
      return;
    }
    // ---- Streaming: the last chunk (finish reason, usage) or the error, then [DONE].
    if (!finished) {
      g.res->WriteChunk("data: " + ErrorBody(ErrorFromStatus(s)) + "\n\n");
    } else {
      json logprobs =
          g.parsed->logprobs ? LogprobsJson(g.endpoint, {}, g.text_offset) : json(nullptr);
      g.res->WriteChunk(Event(ChunkJson(g.endpoint, g.id, g.created, g.model, rest, g.first_chunk,
                                        logprobs, b.finish_reason(), std::nullopt)));
      if (g.parsed->include_usage) {
        // As OpenAI and vLLM: only when asked, in a last chunk of its own with no choices.
        json u = ChunkJson(g.endpoint, g.id, g.created, g.model, "", false, json(nullptr), "",
                           b.usage(g.prompt_tokens));
        u["choices"] = json::array();
        g.res->WriteChunk(Event(u));
      }
    }
    g.res->WriteChunk("data: [DONE]\n\n");
    g.res->EndChunked();
  }

  const HttpFrontOptions options_;
  GenerationBackend* const backend_;
  const model::Tokenizer* const tokenizer_;
  metrics::Registry* const registry_;
  metrics::Family<metrics::Counter>& http_requests_;
  metrics::Gauge& streams_;
  metrics::Counter& disconnects_;
  VllmMetrics vllm_;
  const int64_t created_ = absl::ToUnixSeconds(absl::Now());
  std::string id_prefix_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int> active_{0};
  std::atomic<bool> stopping_{false};
  GenerationThreads threads_{
      options_.generation_nice};  // last: joined before the members its threads use go
};

absl::StatusOr<std::unique_ptr<HttpFront>> HttpFront::Start(const HttpFrontOptions& options,
                                                            GenerationBackend* backend,
                                                            const model::Tokenizer* tokenizer,
                                                            metrics::Registry* registry) {
  std::unique_ptr<HttpFront> f(new HttpFront());
  f->handlers_ = std::make_unique<Handlers>(options, backend, tokenizer, registry);
  Handlers* h = f->handlers_.get();
  HttpServerOptions so{.host = options.host,
                       .port = options.port,
                       .io_threads = options.io_threads,
                       .max_body_bytes = options.max_body_bytes,
                       .max_connections = options.max_connections,
                       .header_timeout = options.header_timeout,
                       .body_timeout = options.body_timeout,
                       .idle_timeout = options.idle_timeout};
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
      so,
      [h](HttpRequest req, std::shared_ptr<HttpResponder> res) {
        h->Handle(std::move(req), std::move(res));
      },
      [h](const std::string& path, int status) { h->Log(path, status); },
      [](int status, const std::string& code, const std::string& message) {
        ApiError e{.http_status = status, .message = message, .code = code};
        if (status >= 500) e.type = "server_error";
        return HttpErrorBody{kJson, ErrorBody(e)};
      });
  if (!server.ok()) return server.status();
  f->server_ = *std::move(server);
  f->port_ = f->server_->port();
  return f;
}

HttpFront::~HttpFront() { Stop(); }

void HttpFront::Stop() {
  // Generations first: their responders hold connections of the server. Again after the server
  // stopped, for one admitted while the first wait ran.
  if (handlers_) handlers_->Stop();
  if (server_) server_->Stop();
  if (handlers_) handlers_->Stop();
}

std::string ModelNameFromPath(std::string model_path) {
  while (!model_path.empty() && model_path.back() == '/') model_path.pop_back();
  return model_path.substr(model_path.rfind('/') + 1);
}

}  // namespace duet::http
