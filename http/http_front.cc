#include "http/http_front.h"

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "http/added_headers.h"
#include "http/generation_threads.h"
#include "http/metrics_targets.h"
#include "http/openai_protocol.h"
#include "http/prompt_encoder.h"
#include "http/response_builder.h"
#include "http/routes.h"
#include "http/tool_calls.h"
#include "http/vllm_metrics.h"

namespace duet::http {
namespace {

using nlohmann::json;

constexpr char kJson[] = "application/json";

// One choice of a request: one backend generation (one prompt, one sample).
struct Choice {
  int index = 0;   // in the response: prompt * n + sample
  int leader = 0;  // the index of the first choice of the same prompt (itself for the first)
  v1::GenerateRequest request;
  int64_t prompt_tokens = 0;
  std::string echo;                    // text the choice starts with (echo: its prompt)
  std::atomic<bool> satisfied{false};  // its stop string matched: it ends, as finished
  std::atomic<bool> kv_shared{false};  // leader: the prompt's KV is in the caches, or it ended
};

// What a choice's responses built so far.
struct ChoiceState {
  std::unique_ptr<ResponseBuilder> builder;
  bool first_chunk = true;
  size_t text_offset = 0;
  std::vector<TokenOut> logprobs;  // not streamed: every token's
  // echo with logprobs: the prompt's tokens, the first without a logprob (set with the first
  // response; a later choice of the prompt takes its first choice's).
  std::optional<std::vector<TokenOut>> prompt_logprobs;
  std::optional<VllmMetrics::Request> vllm;   // the vllm:* series
  std::optional<v1::RequestTimings> timings;  // from the finishing response
  // Chat with a tool_choice other than none, streamed: the output as content and tool calls.
  std::optional<ToolCallExtractor> tools;
};

// One request's state, shared by its choices' backend sink calls (each on its own thread) and
// the generation thread that ends the response once every choice's GenerateTo returned.
struct Generation {
  Endpoint endpoint;
  std::string model;  // the served name responses report: the request's, else the first
  std::shared_ptr<ParsedRequest> parsed;
  std::string id;
  std::shared_ptr<HttpResponder> res;
  std::vector<std::unique_ptr<Choice>> choices;
  std::atomic<bool> failed{false};  // a choice failed: the others stop
  std::atomic<bool> client_gone{false};
  // Concurrency slots it holds, given back once (ReleaseSlots): before its last bytes are
  // written, so that a client that sends its next request on reading them finds its slot free.
  int slots = 0;
  std::atomic<bool> slots_released{false};
  absl::Mutex mu;
  absl::Status failure ABSL_GUARDED_BY(mu);            // the first failed choice's
  std::vector<ChoiceState> state ABSL_GUARDED_BY(mu);  // one per choice
  bool responded ABSL_GUARDED_BY(mu) = false;  // a first response arrived (the head is sent)
  int64_t created ABSL_GUARDED_BY(mu) = 0;
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
        vllm_(registry, ServedNames().front(), [backend] { return backend->Health(); }),
        prompts_(tokenizer, options.vocab_size, options.chat_template) {
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
    // Headers every response to this request carries, whatever answers it.
    HttpHeaders extra = CorsHeaders(options_.cors, req);
    if (std::string id = req.Header("X-Request-Id"); !id.empty()) {
      extra.emplace_back("X-Request-Id", std::move(id));
    }
    res = WithHeaders(std::move(res), std::move(extra));
    if (IsPreflight(req)) {  // a browser asks before its request; it sends no key for this
      Preflight p = AnswerPreflight(options_.cors, req);
      return res->Reply(p.status, p.headers, "text/plain; charset=utf-8", std::move(p.body));
    }
    if (!options_.api_key.empty() && NeedsApiKey(req.path) &&
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
      HttpHeaders headers;
      if (!h.ready()) headers.emplace_back("Retry-After", "1");
      return res->Reply(h.ready() ? 200 : 503, headers, kJson, Dump(HealthJson(h)));
    }
    if ((get || req.method == "POST") && req.path == "/ping") {  // vLLM's, for SageMaker
      HttpHeaders headers;
      const bool ready = backend_->Health().ready();
      if (!ready) headers.emplace_back("Retry-After", "1");
      return res->Reply(ready ? 200 : 503, headers, "text/plain; charset=utf-8", "");
    }
    if (get && req.path == "/metrics") {
      return res->Reply(200, {}, "text/plain; version=0.0.4; charset=utf-8", registry_->Render());
    }
    if (get && req.path == "/metrics/targets") {
      // This server's own /metrics is where the request came in: the address in its Host header.
      const std::string host = req.Header("Host");
      if (host.empty()) {
        return Reply(*res,
                     ApiError{.message = "GET /metrics/targets needs a Host header (this "
                                         "server's own target is the address it was asked at)",
                              .code = "missing_host"});
      }
      return res->Reply(200, {}, kJson,
                        Dump(MetricsTargets(backend_->Health(),
                                            {.kind = options_.server_kind, .address = host})));
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
    if (ep == Endpoint::kCompletions && parsed.prompts.size() != 1) {
      return ApiError{
          .message = "/tokenize takes one prompt", .param = "prompt", .code = "invalid_value"};
    }
    std::vector<int32_t> ids;
    if (std::optional<ApiError> e =
            prompts_.PromptIds(parsed, ep == Endpoint::kChat ? nullptr : &parsed.prompts[0],
                               add_special, ep == Endpoint::kChat ? "messages" : "prompt", &ids)) {
      return *e;
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
    std::string text;
    if (std::optional<ApiError> e = prompts_.Detokenize(*it, &text)) return *e;
    return json{{"prompt", text}};
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
  static void Reply(HttpResponder& res, const ApiError& e) {
    HttpHeaders headers;
    if (e.retry_after_s > 0) headers.emplace_back("Retry-After", absl::StrCat(e.retry_after_s));
    res.Reply(e.http_status, headers, kJson, ErrorBody(e));
  }

  // Parsing and tokenizing (up to max_body_bytes of prompt) happen off the event loop too, on
  // the thread that then runs the generation; a request refused on the way (400, 429) ends it.
  // The request takes its first slot here, on the I/O thread: beyond max_concurrent_streams it
  // is refused before a thread is made for it, so that a flood of requests costs no threads.
  void Spawn(Endpoint endpoint, HttpRequest req, std::shared_ptr<HttpResponder> res) {
    if (active_.fetch_add(1) + 1 > options_.max_concurrent_streams) {
      active_.fetch_sub(1);
      return Reply(*res, TooManyRequests());
    }
    threads_.Run([this, endpoint, req = std::move(req), res = std::move(res)]() mutable {
      Generate(endpoint, req, std::move(res));
    });
  }

  ApiError TooManyRequests() const {
    return ApiError{.http_status = 429,
                    .type = "rate_limit_error",
                    .message = absl::StrCat("too many concurrent requests (limit ",
                                            options_.max_concurrent_streams, ")"),
                    .code = "too_many_requests",
                    .retry_after_s = 1};
  }

  // On a generation thread: checks, admission of its further choices (Spawn took one slot),
  // then the generation itself; every slot it holds is released when it returns.
  void Generate(Endpoint endpoint, const HttpRequest& hreq, std::shared_ptr<HttpResponder> res) {
    int held = 1;  // slots taken
    absl::Cleanup release = [this, &held] { active_.fetch_sub(held); };
    auto parsed = std::make_shared<ParsedRequest>();
    if (std::optional<ApiError> e = ParseRequest(endpoint, hreq.body, parsed.get())) {
      return Reply(*res, *e);
    }
    if (!parsed->model.empty()) {
      if (std::optional<ApiError> e = CheckModel(parsed->model)) return Reply(*res, *e);
    }
    if (parsed->tools.choice == ToolChoice::kAuto &&
        (!options_.enable_auto_tool_choice || options_.tool_call_parser == ToolCallParser::kNone)) {
      // As vLLM: the server must know how its model writes calls.
      return Reply(*res, ApiError{.message = "tool_choice \"auto\" (the default when tools are "
                                             "given) needs the server started with "
                                             "--enable_auto_tool_choice and --tool_call_parser",
                                  .param = "tool_choice",
                                  .code = "unsupported"});
    }
    // logit_bias ids name tokens of the model's vocabulary: a client error, before any backend.
    for (const compute::LogitBias& b : parsed->logit_bias) {
      if (b.id >= prompts_.vocab_size()) {
        return Reply(*res, ApiError{.message = absl::StrCat("logit_bias names token ", b.id,
                                                            ", outside the vocabulary of ",
                                                            prompts_.vocab_size()),
                                    .param = "logit_bias",
                                    .code = "invalid_value"});
      }
    }
    // ---- Each prompt as token ids, checked against the vocabulary and the context.
    const size_t num_prompts = endpoint == Endpoint::kChat ? 1 : parsed->prompts.size();
    std::vector<std::vector<int32_t>> prompt_ids(num_prompts);
    for (size_t i = 0; i < num_prompts; ++i) {
      const ParsedRequest::Prompt* p = endpoint == Endpoint::kChat ? nullptr : &parsed->prompts[i];
      const std::string param = endpoint == Endpoint::kChat ? "messages"
                                : num_prompts > 1           ? absl::StrCat("prompt[", i, "]")
                                                            : "prompt";
      if (std::optional<ApiError> e =
              prompts_.PromptIds(*parsed, p, /*add_special=*/true, param, &prompt_ids[i])) {
        return Reply(*res, *e);
      }
      // (max_tokens' default is set by the first call: 16 for completions; chat has one prompt.)
      if (std::optional<ApiError> e = CheckLengths(
              parsed.get(), static_cast<int64_t>(prompt_ids[i].size()), MaxModelLen())) {
        return Reply(*res, *e);
      }
    }
    // ---- Admission: a bounded number of generations (choices) in flight.
    const int total = static_cast<int>(num_prompts) * parsed->n;
    if (total > options_.max_concurrent_streams) {
      return Reply(*res,
                   ApiError{.message = absl::StrCat(total, " choices (prompts x n) exceed the ",
                                                    options_.max_concurrent_streams,
                                                    " generations this server runs at once"),
                            .param = "n",
                            .code = "invalid_value"});
    }
    if (stopping_.load()) {
      return Reply(*res, ApiError{.http_status = 503,
                                  .type = "server_error",
                                  .message = "the server is shutting down",
                                  .code = "shutting_down",
                                  .retry_after_s = 1});
    }
    if (total > held) {
      const int more = total - held;
      if (active_.fetch_add(more) + more > options_.max_concurrent_streams) {
        active_.fetch_sub(more);
        return Reply(*res, TooManyRequests());
      }
      held = total;
    }
    streams_.Add(total);

    auto g = std::make_shared<Generation>();
    g->slots = held;
    held = 0;  // the generation's now (ReleaseSlots)
    g->endpoint = endpoint;
    g->model = parsed->model.empty() ? ServedNames().front() : parsed->model;
    g->id = absl::StrCat(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-", id_prefix_, "-",
                         next_id_.fetch_add(1));
    g->res = std::move(res);
    const v1::SamplingParams sampling = ToSampling(*parsed);
    {
      absl::MutexLock lock(&g->mu);
      g->state.reserve(total);
      for (size_t i = 0; i < num_prompts; ++i) {
        for (int j = 0; j < parsed->n; ++j) {
          auto c = std::make_unique<Choice>();
          c->index = static_cast<int>(i) * parsed->n + j;
          c->leader = static_cast<int>(i) * parsed->n;
          c->request.set_request_id(total == 1 ? g->id : absl::StrCat(g->id, "-", c->index));
          c->request.mutable_token_ids()->mutable_ids()->Assign(prompt_ids[i].begin(),
                                                                prompt_ids[i].end());
          *c->request.mutable_sampling() = sampling;
          // As vLLM: choice j of a seeded request draws with seed + j; without a seed every
          // choice draws its own.
          c->request.mutable_sampling()->set_seed(parsed->seed ? *parsed->seed + j : NewSeed());
          if (j > 0) {
            c->request.set_share_prompt_with(g->choices[c->leader]->request.request_id());
            // The prompt's logprobs come from its first choice (scoring it again would compute
            // the whole prompt again).
            c->request.mutable_sampling()->clear_prompt_logprobs();
          }
          c->prompt_tokens = static_cast<int64_t>(prompt_ids[i].size());
          if (parsed->echo) c->echo = prompts_.EchoText(parsed->prompts[i]);
          ChoiceState st;
          st.builder = std::make_unique<ResponseBuilder>(*parsed, tokenizer_);
          st.tools = Extractor(*parsed, g->id, c->index);
          st.vllm.emplace(vllm_.Start());
          g->state.push_back(std::move(st));
          g->choices.push_back(std::move(c));
        }
      }
    }
    g->parsed = std::move(parsed);
    Run(*g);
    ReleaseSlots(*g);  // if Respond did not (the client left first)
    streams_.Add(-total);
  }

  void ReleaseSlots(Generation& g) {
    if (!g.slots_released.exchange(true)) active_.fetch_sub(g.slots);
  }

  // The prompt's tokens with their logprobs (from the first response; the first token has
  // none), as echo with logprobs reports them.
  std::vector<TokenOut> PromptLogprobs(const v1::GenerateRequest& req,
                                       const v1::GenerateResponse& r) const {
    std::vector<TokenOut> out;
    const auto& ids = req.token_ids().ids();
    for (int i = 0; i < ids.size(); ++i) {
      // The first token has no logprob; nor would one the backend did not score (null, never a
      // made-up 0).
      TokenOut t{.id = ids[i],
                 .text = TokenText(*tokenizer_, ids[i]),
                 .no_logprob = i == 0 || i - 1 >= r.prompt_logprobs_size()};
      if (!t.no_logprob) {
        const v1::TokenLogprob& p = r.prompt_logprobs(i - 1);
        t.logprob = p.logprob();
        for (const v1::TopLogprob& top : p.top_logprobs()) {
          t.top.emplace_back(TokenText(*tokenizer_, top.token_id()), top.logprob());
        }
      }
      out.push_back(std::move(t));
    }
    return out;
  }

  // The choice's tool-call extraction: chat with tools and a tool_choice other than none.
  std::optional<ToolCallExtractor> Extractor(const ParsedRequest& parsed, const std::string& id,
                                             int index) const {
    if (parsed.endpoint != Endpoint::kChat || parsed.tools.choice == ToolChoice::kNone) {
      return std::nullopt;
    }
    return ToolCallExtractor(parsed.tools, options_.tool_call_parser,
                             absl::StrCat(id, "-tool-", index));
  }

  uint64_t NewSeed() {
    absl::MutexLock lock(&seed_mu_);
    return seeds_();
  }

  // True when the choice must end: its stop string matched, another choice failed, the front
  // stops, or the client has gone (counted once).
  bool Ended(Generation& g, const Choice& c) {
    if (g.res->gone() && !g.client_gone.exchange(true)) disconnects_.Increment();
    return c.satisfied.load() || g.failed.load() || stopping_.load() || g.client_gone.load();
  }

  // One response of a choice from the backend: the head on the request's first, then SSE
  // events (streamed) or accumulation (not streamed). False: stop producing.
  bool Write(Generation& g, Choice& c, const v1::GenerateResponse& r) {
    {
      // Every token the backend generated counts, also one that arrives after a stop string.
      absl::MutexLock lock(&g.mu);
      ChoiceState& st = g.state[c.index];
      if (r.has_token()) st.vllm->OnToken(absl::Now());
      if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) st.timings = r.timings();
      // A token after the first comes from the decode node, which holds the prompt's KV by then
      // (and the prefill node since its pass): the other choices of the prompt may start.
      if (r.index() >= 1 || r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        c.kv_shared.store(true);
      }
    }
    if (Ended(g, c)) return false;
    absl::MutexLock lock(&g.mu);
    ChoiceState& st = g.state[c.index];
    ResponseBuilder& b = *st.builder;
    if (g.parsed->prompt_logprobs >= 0 && !st.prompt_logprobs && r.has_token()) {
      st.prompt_logprobs =
          c.leader == c.index ? PromptLogprobs(c.request, r) : g.state[c.leader].prompt_logprobs;
    }
    if (!g.responded) {
      g.responded = true;
      g.created = absl::ToUnixSeconds(absl::Now());
      if (g.parsed->stream) {
        g.res->StartChunked(200, {{"Cache-Control", "no-cache"}, {"X-Request-Id", g.id}},
                            "text/event-stream", ": ping\n\n");
      }
    }
    if (!g.parsed->stream) {
      b.Consume(r, &st.logprobs);
    } else {
      std::vector<TokenOut> lp;
      std::string piece = b.Consume(r, &lp);
      json tool_calls(nullptr);
      if (st.tools) {
        ChatDelta d = st.tools->Add(piece);
        piece = std::move(d.content);
        tool_calls = ToolCallDeltasJson(d.tool_calls);
      }
      if (!piece.empty() || !lp.empty() || st.first_chunk || !tool_calls.is_null()) {
        // echo: a choice's first chunk starts with its prompt (and its tokens' logprobs).
        const std::string text = st.first_chunk ? c.echo + piece : piece;
        size_t offset = st.text_offset;
        if (st.first_chunk && st.prompt_logprobs) {
          lp.insert(lp.begin(), st.prompt_logprobs->begin(), st.prompt_logprobs->end());
          offset = 0;
        }
        if (st.first_chunk) st.text_offset += c.echo.size();
        json logprobs = g.parsed->logprobs ? LogprobsJson(g.endpoint, lp, offset) : json(nullptr);
        st.text_offset += piece.size();
        if (!g.res->WriteChunk(
                Event(ChunkJson(g.endpoint, g.id, g.created, g.model, c.index, text, st.first_chunk,
                                logprobs, "", std::nullopt, tool_calls)))) {
          Ended(g, c);
          return false;
        }
        st.first_chunk = false;
      }
    }
    // The front has what it asked for: the choice ends as satisfied.
    if (b.stopped()) c.satisfied.store(true);
    return true;
  }

  static std::string Event(const json& j) { return "data: " + Dump(j) + "\n\n"; }

  // On the generation's thread: runs every choice (each on a thread of its own; the other
  // choices of a prompt start once its first one's KV is in the caches, so that they share it),
  // then ends the response.
  void Run(Generation& g) {
    std::vector<std::thread> threads;
    for (size_t k = 1; k < g.choices.size(); ++k) {
      threads.emplace_back([this, &g, k] { RunChoice(g, *g.choices[k]); });
    }
    RunChoice(g, *g.choices[0]);
    for (std::thread& t : threads) t.join();
    Respond(g);
  }

  void RunChoice(Generation& g, Choice& c) {
    if (c.leader != c.index) {
      // Bounded by the leader's own deadlines: it sets kv_shared at the latest when it ends.
      const Choice& leader = *g.choices[c.leader];
      absl::MutexLock lock(&g.mu);
      while (!leader.kv_shared.load() && !Ended(g, c)) {
        g.mu.AwaitWithTimeout(absl::Condition(
                                  +[](const Choice* l) { return l->kv_shared.load(); }, &leader),
                              absl::Milliseconds(50));
      }
    }
    GenerateSink sink;
    sink.write = [this, &g, &c](const v1::GenerateResponse& r) { return Write(g, c, r); };
    sink.cancelled = [this, &g, &c] { return Ended(g, c); };
    sink.satisfied = [&c] { return c.satisfied.load(); };
    sink.scheduled = [&g, &c](bool running) {
      absl::MutexLock lock(&g.mu);
      g.state[c.index].vllm->OnScheduled(running);
    };
    absl::Status s = Ended(g, c) ? absl::CancelledError("the request ended before this choice")
                                 : backend_->GenerateTo(c.request, sink);
    Ended(g, c);  // a client that left near the end is counted too
    absl::MutexLock lock(&g.mu);
    c.kv_shared.store(true);
    ChoiceState& st = g.state[c.index];
    ResponseBuilder& b = *st.builder;
    const std::string rest = b.Finish();
    const bool finished = b.stopped() || !b.finish_reason().empty();
    st.vllm->Finish(c.prompt_tokens, finished ? b.finish_reason() : "abort",
                    st.timings ? &*st.timings : nullptr);
    if (!finished) {
      // The first failure is the request's (the others it cancelled follow it).
      if (s.ok()) s = absl::InternalError("the request ended without a finish reason");
      if (!g.failed.exchange(true)) g.failure = s;
      return;
    }
    if (!g.parsed->stream || g.client_gone.load()) return;
    // ---- Streaming: this choice's last chunk (the rest of its text, its finish reason).
    std::string last = rest;
    json tool_calls(nullptr);
    std::string finish_reason = b.finish_reason();
    if (st.tools) {
      ChatDelta d = st.tools->Add(rest);
      ChatDelta end = st.tools->Finish();
      last = d.content + end.content;
      d.tool_calls.insert(d.tool_calls.end(), end.tool_calls.begin(), end.tool_calls.end());
      tool_calls = ToolCallDeltasJson(d.tool_calls);
      finish_reason = st.tools->FinishReason(finish_reason);
    }
    const std::string text = st.first_chunk ? c.echo + last : last;
    if (st.first_chunk) st.text_offset += c.echo.size();
    json logprobs =
        g.parsed->logprobs ? LogprobsJson(g.endpoint, {}, st.text_offset) : json(nullptr);
    g.res->WriteChunk(
        Event(ChunkJson(g.endpoint, g.id, g.created, g.model, c.index, text, st.first_chunk,
                        logprobs, finish_reason, std::nullopt, tool_calls)));
    st.first_chunk = false;
  }

  // Once every choice ended: the whole response, or the end of the stream (usage, [DONE]), or
  // the first failure.
  void Respond(Generation& g) {
    ReleaseSlots(g);
    absl::MutexLock lock(&g.mu);
    if (g.client_gone.load()) return;  // nobody to answer
    if (g.failed.load() && (!g.responded || !g.parsed->stream)) {
      // Failures before any token get a real status; so does any failure when not streamed.
      return Reply(*g.res, ErrorFromStatus(g.failure));
    }
    // The usage of the request: each prompt once, every choice's tokens.
    Usage usage;
    for (const std::unique_ptr<Choice>& c : g.choices) {
      const Usage u = g.state[c->index].builder->usage(c->prompt_tokens);
      usage.completion_tokens += u.completion_tokens;
      if (c->leader == c->index) {
        usage.prompt_tokens += u.prompt_tokens;
        usage.cached_tokens += u.cached_tokens;
      }
    }
    if (!g.parsed->stream) {
      std::vector<ChoiceOut> out;
      for (const std::unique_ptr<Choice>& c : g.choices) {
        ChoiceState& st = g.state[c->index];
        json logprobs(nullptr);
        if (g.parsed->logprobs && st.prompt_logprobs) {
          std::vector<TokenOut> all = *st.prompt_logprobs;
          all.insert(all.end(), st.logprobs.begin(), st.logprobs.end());
          logprobs = LogprobsJson(g.endpoint, all, 0);
        } else if (g.parsed->logprobs) {
          logprobs = LogprobsJson(g.endpoint, st.logprobs, c->echo.size());
        }
        ChoiceOut choice{.text = c->echo + st.builder->full_text(),
                         .logprobs = std::move(logprobs),
                         .finish_reason = st.builder->finish_reason()};
        if (st.tools) {
          // The same extraction as a stream's, over the whole text.
          st.tools->Add(choice.text);
          st.tools->Finish();
          choice.text = st.tools->content();
          if (st.tools->called()) choice.tool_calls = ToolCallsJson(st.tools->calls());
          choice.finish_reason = st.tools->FinishReason(choice.finish_reason);
        }
        out.push_back(std::move(choice));
      }
      g.res->Reply(200, {}, kJson,
                   Dump(ResponseJson(g.endpoint, g.id, g.created, g.model, out, usage)));
      return;
    }
    // ---- Streaming: the error, or the usage chunk, then [DONE].
    if (g.failed.load()) {
      g.res->WriteChunk("data: " + ErrorBody(ErrorFromStatus(g.failure)) + "\n\n");
    } else if (g.parsed->include_usage) {
      // As OpenAI and vLLM: only when asked, in a last chunk of its own with no choices.
      json u =
          ChunkJson(g.endpoint, g.id, g.created, g.model, 0, "", false, json(nullptr), "", usage);
      u["choices"] = json::array();
      g.res->WriteChunk(Event(u));
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
  const PromptEncoder prompts_;  // prompts as token ids, with the chat template
  const int64_t created_ = absl::ToUnixSeconds(absl::Now());
  std::string id_prefix_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int> active_{0};
  std::atomic<bool> stopping_{false};
  absl::Mutex seed_mu_;
  std::mt19937_64 seeds_ ABSL_GUARDED_BY(seed_mu_){std::random_device{}()};
  GenerationThreads threads_{
      options_.generation_nice};  // last: joined before the members its threads use go
};

absl::StatusOr<std::unique_ptr<HttpFront>> HttpFront::Start(const HttpFrontOptions& options,
                                                            GenerationBackend* backend,
                                                            const model::Tokenizer* tokenizer,
                                                            metrics::Registry* registry) {
  if (options.write_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("http: write_timeout (--http-write-timeout-s) must be positive, not ",
                     absl::FormatDuration(options.write_timeout)));
  }
  if (options.max_body_bytes < 1) {
    return absl::InvalidArgumentError("http: max_body_bytes (--max-body-bytes) must be at least 1");
  }
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("http: max_connections (--http-max-connections) must be at least 1, not ",
                     options.max_connections));
  }
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
                       .idle_timeout = options.idle_timeout,
                       .write_timeout = options.write_timeout,
                       .tls = options.tls};
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
