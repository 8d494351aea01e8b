// HttpFront over a scripted GenerationBackend, on 127.0.0.1: status codes and OpenAI error
// bodies (429/503 with Retry-After), server-sent events, n choices and lists of prompts (seeds,
// order, when later choices start, a failed choice), the concurrency limit, stop strings (ending
// the request as satisfied), special tokens in the text, chat templates, vLLM's metrics, and a
// client disconnect (mid-stream or before a non-streamed answer) reaching the backend as a
// cancellation. The routes besides generation: http_front_routes_test.cc.
#include "http/http_front.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/tokenizer/byte_tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/integration/http_exchange.h"
#include "tests/integration/http_front_rig.h"

namespace duet::http {
namespace {

using nlohmann::json;

TEST_F(HttpFrontTest, CompletionNotStreamed) {
  StartFront();
  Reply r = Post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 5}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["text"], "Hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);  // <|bos|> H i
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  // The prompt reached the backend as token ids, with the sampling parameters.
  EXPECT_EQ(backend_.last_request.token_ids().ids_size(), 3);
  EXPECT_EQ(backend_.last_request.sampling().max_tokens(), 5);
}

// Usage comes only with stream_options.include_usage, as OpenAI and vLLM send it: in a last
// chunk of its own, with no choices, just before [DONE].
TEST_F(HttpFrontTest, ChatStreamedAsServerSentEvents) {
  StartFront();
  for (bool include_usage : {false, true}) {
    SCOPED_TRACE(include_usage ? "include_usage" : "no usage asked");
    json body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"stream", true}};
    if (include_usage) body["stream_options"] = {{"include_usage", true}};
    Reply r = Post("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_NE(r.head.find("text/event-stream"), std::string::npos);
    std::string text;
    std::vector<json> chunks;
    bool done = false;
    std::string finish;
    size_t pos = 0;
    while ((pos = r.body.find("data: ", pos)) != std::string::npos) {
      const size_t end = r.body.find("\n\n", pos);
      const std::string data = r.body.substr(pos + 6, end - pos - 6);
      pos = end;
      if (data == "[DONE]") {
        done = true;
        continue;
      }
      chunks.push_back(json::parse(data));
    }
    ASSERT_GE(chunks.size(), 2u);
    const size_t with_choices = include_usage ? chunks.size() - 1 : chunks.size();
    for (size_t i = 0; i < chunks.size(); ++i) {
      const json& c = chunks[i];
      EXPECT_EQ(c["object"], "chat.completion.chunk");
      if (i >= with_choices) continue;
      EXPECT_FALSE(c.contains("usage")) << c.dump();
      if (i == 0) {
        EXPECT_EQ(c["choices"][0]["delta"]["role"], "assistant");
      }
      text += c["choices"][0]["delta"].value("content", "");
      if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    if (include_usage) {
      const json& u = chunks.back();
      EXPECT_EQ(u["choices"], json::array()) << u.dump();
      EXPECT_EQ(u["usage"]["completion_tokens"], 5) << u.dump();
    }
    EXPECT_EQ(text, "Hello");
    EXPECT_EQ(finish, "length");
    EXPECT_TRUE(done);
  }
}

TEST_F(HttpFrontTest, ChatRendersTheTemplateAndRefusesRolesItCannotTake) {
  StartFront({}, "{{ bos_token }}[INST] {{ m }} [/INST]{{ eos_token }}");
  Reply r =
      Post("/v1/chat/completions",
           {{"messages",
             {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "Hi"}}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  // <|bos|> (once, though the rendered text starts with it) "[INST] S\n\nHi [/INST]".
  const auto& ids = backend_.last_request.token_ids().ids();
  ASSERT_EQ(ids.size(), 1u + std::string("[INST] S\n\nHi [/INST]").size());
  EXPECT_EQ(ids[0], model::ByteTokenizer::kBosId);
  EXPECT_EQ(ids[1], '[');
  const int calls = backend_.calls.load();
  r = Post(
      "/v1/chat/completions",
      {{"messages", {{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}}}});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(Error(r)["message"].get<std::string>().find("alternat"), std::string::npos) << r.body;
  EXPECT_EQ(backend_.calls.load(), calls);  // refused before generating
}

// vLLM's /tokenize and /detokenize, /version and /v1/models/{id}.
TEST_F(HttpFrontTest, TokenizeDetokenizeVersionAndModelById) {
  StartFront({.model_name = "tiny"});
  Reply r = Post("/tokenize", {{"prompt", "Hi!"}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  auto want = tokenizer_->Encode("Hi!", /*add_bos=*/true);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), *want);
  EXPECT_EQ(j["count"], want->size());
  EXPECT_EQ(j["max_model_len"], 64);
  r = Post("/tokenize", {{"prompt", "Hi!"}, {"add_special_tokens", false}});
  ASSERT_EQ(r.status, 200) << r.body;
  auto bare = tokenizer_->Encode("Hi!", /*add_bos=*/false);
  EXPECT_EQ(json::parse(r.body)["tokens"].get<std::vector<int32_t>>(), *bare);
  r = Post("/tokenize", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_GT(json::parse(r.body)["count"].get<int>(), 2);
  r = Post("/tokenize", {{"prompt", "x"}, {"bad_words", {"y"}}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Error(r)["param"], "bad_words");

  r = Post("/detokenize", {{"tokens", *bare}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["prompt"], "Hi!");
  r = Post("/detokenize", {{"tokens", {1, 100000}}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Error(r)["param"], "tokens");
  r = Post("/detokenize", {{"tokens", "abc"}});
  EXPECT_EQ(r.status, 400);

  r = Exchange(front_->port(), "GET", "/version", "");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(json::parse(r.body)["version"].get<std::string>().empty());
  r = Exchange(front_->port(), "GET", "/v1/models/tiny", "");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["id"], "tiny");
  r = Exchange(front_->port(), "GET", "/v1/models/gpt-4", "");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(Error(r)["code"], "model_not_found");
  EXPECT_EQ(backend_.calls.load(), 0) << "none of these reach the generation backend";
}

// --served-model-name: /v1/models lists every name, a request may name any of them (and is
// answered under that name), and any other model is a 404 model_not_found that never reaches
// the backend; a request naming no model is served under the first name.
TEST_F(HttpFrontTest, ServedModelNamesAndUnknownModels) {
  StartFront({.served_model_names = {"smollm2", "sm2"}, .model_name = "smollm2"});
  Reply r = Exchange(front_->port(), "GET", "/v1/models", "");
  ASSERT_EQ(r.status, 200) << r.body;
  const json data = json::parse(r.body)["data"];
  ASSERT_EQ(data.size(), 2u) << r.body;
  EXPECT_EQ(data[0]["id"], "smollm2");
  EXPECT_EQ(data[1]["id"], "sm2");
  EXPECT_EQ(Exchange(front_->port(), "GET", "/v1/models/sm2", "").status, 200);
  r = Post("/v1/completions", {{"model", "sm2"}, {"prompt", "Hi"}, {"max_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["model"], "sm2");
  r = Post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["model"], "smollm2");
  const int calls = backend_.calls.load();
  for (const char* path : {"/v1/completions", "/v1/chat/completions", "/tokenize"}) {
    json body = {{"model", "gpt-4"}, {"max_tokens", 2}};
    if (std::string(path) == "/v1/chat/completions") {
      body["messages"] = {{{"role", "user"}, {"content", "Hi"}}};
    } else {
      body["prompt"] = "Hi";
    }
    if (std::string(path) == "/tokenize") body.erase("max_tokens");
    r = Post(path, body);
    EXPECT_EQ(r.status, 404) << path << ": " << r.body;
    EXPECT_EQ(Error(r)["code"], "model_not_found") << path;
    EXPECT_EQ(Error(r)["param"], "model") << path;
    EXPECT_NE(Error(r)["message"].get<std::string>().find("gpt-4"), std::string::npos) << path;
  }
  EXPECT_EQ(backend_.calls.load(), calls);
}

// Prometheus text -> {series (name and labels as printed): value}.
std::map<std::string, double> ParseMetrics(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

// The vLLM-named series a vLLM dashboard reads: a request waits until the backend says a
// scheduler took it, then runs; its tokens, gaps, phases and finish reason land under vLLM's
// names with model_name.
TEST_F(HttpFrontTest, VllmNamedMetrics) {
  absl::Notification scheduled, go;
  backend_.schedule_after = &scheduled;
  backend_.block_until = &go;
  backend_.gap = absl::Milliseconds(20);
  StartFront({.model_name = "tiny"});
  std::thread client([&] {
    Reply r = Post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 5}});
    EXPECT_EQ(r.status, 200) << r.body;
  });
  const std::string w = "{model_name=\"tiny\"}";
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (ParseMetrics(registry_.Render())["vllm:num_requests_waiting" + w] != 1 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  auto m = ParseMetrics(registry_.Render());
  EXPECT_EQ(m["vllm:num_requests_waiting" + w], 1);
  EXPECT_EQ(m["vllm:num_requests_running" + w], 0);
  // Scheduled, before any token: running (prefilling).
  scheduled.Notify();
  while (ParseMetrics(registry_.Render())["vllm:num_requests_running" + w] != 1 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  m = ParseMetrics(registry_.Render());
  EXPECT_EQ(m["vllm:num_requests_waiting" + w], 0);
  EXPECT_EQ(m["vllm:num_requests_running" + w], 1);
  EXPECT_EQ(m["vllm:time_to_first_token_seconds_count" + w], 0);
  go.Notify();
  client.join();
  m = ParseMetrics(registry_.Render());
  EXPECT_EQ(m["vllm:num_requests_waiting" + w], 0);
  EXPECT_EQ(m["vllm:num_requests_running" + w], 0);
  EXPECT_DOUBLE_EQ(m["vllm:kv_cache_usage_perc" + w], 0.6);
  EXPECT_EQ(m["vllm:prompt_tokens_total" + w], 3);  // <|bos|> H i
  EXPECT_EQ(m["vllm:generation_tokens_total" + w], 5);
  EXPECT_EQ(m["vllm:request_success_total{model_name=\"tiny\",finished_reason=\"length\"}"], 1);
  EXPECT_EQ(m["vllm:request_success_total{model_name=\"tiny\",finished_reason=\"stop\"}"], 0);
  EXPECT_EQ(m["vllm:time_to_first_token_seconds_count" + w], 1);
  EXPECT_EQ(m["vllm:inter_token_latency_seconds_count" + w], 4);
  EXPECT_GE(m["vllm:inter_token_latency_seconds_sum" + w], 4 * 0.018);
  EXPECT_EQ(m["vllm:time_per_output_token_seconds_count" + w], 1);
  EXPECT_EQ(m["vllm:e2e_request_latency_seconds_count" + w], 1);
  EXPECT_DOUBLE_EQ(m["vllm:request_queue_time_seconds_sum" + w], 0.002);
  EXPECT_EQ(m["vllm:request_prefill_time_seconds_count" + w], 1);
  EXPECT_DOUBLE_EQ(m["vllm:request_decode_time_seconds_sum" + w], 0.04);
  EXPECT_EQ(m["vllm:request_prompt_tokens_count" + w], 1);
  EXPECT_EQ(m["vllm:request_prompt_tokens_sum" + w], 3);
  EXPECT_EQ(m["vllm:request_prompt_tokens_bucket{model_name=\"tiny\",le=\"2\"}"], 0);
  EXPECT_EQ(m["vllm:request_prompt_tokens_bucket{model_name=\"tiny\",le=\"5\"}"], 1);
  EXPECT_EQ(m["vllm:request_generation_tokens_sum" + w], 5);
  EXPECT_EQ(m["vllm:prefix_cache_queries_total" + w], 3);
  EXPECT_EQ(m["vllm:prefix_cache_hits_total" + w], 2);
  EXPECT_EQ(m["vllm:num_preemptions_total" + w], 1);
  // A cumulative bucket, its bound printed as the shortest decimal that round-trips.
  EXPECT_EQ(m["vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"+Inf\"}"], 1);
  EXPECT_TRUE(m.count("vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.0025\"}"))
      << registry_.Render();
}

// A keep-alive client on 127.0.0.1: sends streamed completions on one connection and notes when
// each SSE event with a token arrives.
class KeepAliveClient {
 public:
  explicit KeepAliveClient(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~KeepAliveClient() {
    if (fd_ >= 0) close(fd_);
  }
  // Arrival times of the token events of one streamed completion (empty on failure).
  std::vector<absl::Time> Stream(const std::string& body) {
    std::vector<absl::Time> at;
    if (!ok_) return at;
    const std::string req = absl::StrCat(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: ",
        body.size(), "\r\n\r\n", body);
    if (send(fd_, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) return at;
    std::string seen;
    size_t scanned = 0;
    char buf[4096];
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    auto done = [&] {
      const size_t d = seen.find("[DONE]");
      return d != std::string::npos && seen.find("0\r\n\r\n", d) != std::string::npos;
    };
    while (!done()) {
      if (absl::Now() > deadline) return {};
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return {};
      const absl::Time now = absl::Now();
      seen.append(buf, static_cast<size_t>(n));
      for (size_t p; (p = seen.find("\"text\":\"", scanned)) != std::string::npos;) {
        if (seen.compare(p, 9, "\"text\":\"\"") != 0) at.push_back(now);  // a non-empty piece
        scanned = p + 1;
      }
    }
    return at;
  }

 private:
  int fd_;
  bool ok_ = false;
};

// Per-token streaming: the second token arrives one backend step after the first on a fresh
// connection and on a kept-alive one alike (no Nagle hold-back of small writes: TCP_NODELAY).
TEST_F(HttpFrontTest, SecondTokenGapIsTheSameOnAReusedConnection) {
  backend_.gap = absl::Milliseconds(30);
  StartFront();
  const std::string body = json{{"prompt", "Hi"}, {"max_tokens", 5}, {"stream", true}}.dump();
  std::vector<double> fresh, reused;
  for (int i = 0; i < 3; ++i) {
    KeepAliveClient c(front_->port());
    const std::vector<absl::Time> a = c.Stream(body);  // fresh connection
    const std::vector<absl::Time> b = c.Stream(body);  // the same connection again
    const std::vector<absl::Time> d = c.Stream(body);
    ASSERT_GE(a.size(), 2u);
    ASSERT_GE(b.size(), 2u);
    ASSERT_GE(d.size(), 2u);
    fresh.push_back(absl::ToDoubleMilliseconds(a[1] - a[0]));
    reused.push_back(absl::ToDoubleMilliseconds(b[1] - b[0]));
    reused.push_back(absl::ToDoubleMilliseconds(d[1] - d[0]));
  }
  std::sort(fresh.begin(), fresh.end());
  std::sort(reused.begin(), reused.end());
  const double f = fresh[fresh.size() / 2], r = reused[reused.size() / 2];
  EXPECT_GT(f, 20.0) << "fresh connection: first-to-second token gap " << f << " ms";
  EXPECT_GT(r, 20.0) << "reused connection: first-to-second token gap " << r << " ms";
  EXPECT_LT(std::fabs(f - r), 15.0) << "fresh " << f << " ms vs reused " << r << " ms";
}

TEST_F(HttpFrontTest, NoCapacityIs429Or503WithRetryAfter) {
  StartFront();
  backend_.fail = absl::ResourceExhaustedError("no free KV blocks");
  Reply r = Post("/v1/completions", {{"prompt", "Hi"}, {"stream", true}});
  EXPECT_EQ(r.status, 429);
  EXPECT_NE(r.head.find("Retry-After: 1"), std::string::npos) << r.head;
  EXPECT_EQ(Error(r)["message"], "no free KV blocks");
  backend_.fail = absl::UnavailableError("no decode node");
  r = Post("/v1/completions", {{"prompt", "Hi"}});
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.head.find("Retry-After"), std::string::npos);
  EXPECT_EQ(Error(r)["type"], "server_error");
}

TEST_F(HttpFrontTest, ValidationErrorsNeverReachTheBackend) {
  StartFront();
  EXPECT_EQ(Exchange(front_->port(), "POST", "/v1/completions", "{nope").status, 400);
  Reply r = Post("/v1/completions", {{"prompt", std::string(80, 'a')}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Error(r)["code"], "context_length_exceeded");
  r = Post("/v1/completions", {{"prompt", {1, 2, 999}}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Error(r)["param"], "prompt");
  EXPECT_EQ(backend_.calls.load(), 0);
}

TEST_F(HttpFrontTest, SpecialTokensAndStopStringsInTheOutput) {
  StartFront();
  backend_.ids = {'H', 'i', 256, '!', 257};  // 256: BOS, 257: EOS (the byte tokenizer's)
  backend_.finish = v1::FINISH_REASON_EOS;
  auto text = [&](const json& extra) {
    json body = {{"prompt", "x"}, {"max_tokens", 8}};
    body.update(extra);
    const Reply r = Post("/v1/completions", body);
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body)["choices"][0].value("text", "");
  };
  const std::string bos = *tokenizer_->Decode({256});
  const std::string eos = *tokenizer_->Decode({257});
  ASSERT_FALSE(bos.empty() || eos.empty());
  EXPECT_EQ(text(json::object()), "Hi!");
  EXPECT_EQ(text({{"skip_special_tokens", false}}), "Hi" + bos + "!");
  EXPECT_EQ(text({{"skip_special_tokens", false}, {"include_stop_str_in_output", true}}),
            "Hi" + bos + "!" + eos);
  EXPECT_EQ(text({{"include_stop_str_in_output", true}}), "Hi!");  // EOS is special: skipped
  backend_.ids.clear();
  backend_.finish = v1::FINISH_REASON_MAX_TOKENS;
  EXPECT_EQ(text({{"stop", {"ll"}}}), "He");
  EXPECT_EQ(text({{"stop", {"ll", "el"}}, {"include_stop_str_in_output", true}}), "Hel");
}

TEST_F(HttpFrontTest, ConcurrencyLimitAnswers429) {
  StartFront({.max_concurrent_streams = 1});
  absl::Notification release;
  backend_.block_until = &release;
  Reply first;
  std::thread t([&] { first = Post("/v1/completions", {{"prompt", "Hi"}}); });
  while (backend_.calls.load() == 0) absl::SleepFor(absl::Milliseconds(5));
  Reply second = Post("/v1/completions", {{"prompt", "Hi"}});
  EXPECT_EQ(second.status, 429);
  EXPECT_EQ(Error(second)["code"], "too_many_requests");
  release.Notify();
  t.join();
  EXPECT_EQ(first.status, 200);
  // The slot is back.
  backend_.block_until = nullptr;
  EXPECT_EQ(Post("/v1/completions", {{"prompt", "Hi"}}).status, 200);
}

TEST_F(HttpFrontTest, ChoicesOfAPromptStartOnceTheFirstHasDecodedAndShareItsPrompt) {
  StartFront();
  backend_.gap = absl::Milliseconds(20);
  Reply r = Post("/v1/completions", {{"prompt", "Hi"}, {"n", 3}, {"seed", 5}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], "Hello");
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);  // "Hi" and BOS, once for the three choices
  EXPECT_EQ(j["usage"]["completion_tokens"], 15);
  absl::MutexLock lock(&backend_.mu);
  ASSERT_EQ(backend_.started.size(), 3u);
  const std::string first = backend_.started[0].first;
  ASSERT_TRUE(absl::EndsWith(first, "-0")) << first;
  ASSERT_TRUE(backend_.second_token.contains(first));
  for (int k = 0; k < 3; ++k) {
    const std::string id = absl::StrCat(first.substr(0, first.size() - 2), "-", k);
    ASSERT_TRUE(backend_.requests.contains(id)) << id;
    const v1::GenerateRequest& req = backend_.requests[id];
    EXPECT_EQ(req.sampling().seed(), 5u + k) << id;  // seed + j, as vLLM
    EXPECT_EQ(req.share_prompt_with(), k == 0 ? "" : first) << id;
  }
  // The later choices started after the first's second token (its KV on the decode node).
  for (size_t k = 1; k < 3; ++k) {
    EXPECT_GE(backend_.started[k].second, backend_.second_token[first])
        << backend_.started[k].first;
  }
}

TEST_F(HttpFrontTest, AListOfPromptsIsPromptMajorAndAFailedChoiceFailsTheRequest) {
  StartFront();
  Reply r = Post("/v1/completions",
                 {{"prompt", {"a", "bb"}}, {"n", 2}, {"echo", true}, {"stream", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  // Each choice's first chunk starts with its prompt; every choice has a finish chunk.
  std::map<int, std::string> text;
  std::map<int, std::string> finish;
  for (size_t pos = 0; (pos = r.body.find("data: {", pos)) != std::string::npos;) {
    const size_t end = r.body.find("\n\n", pos);
    const json chunk = json::parse(r.body.substr(pos + 6, end - pos - 6));
    pos = end;
    for (const json& c : chunk["choices"]) {
      text[c["index"]] += c["text"].get<std::string>();
      if (!c["finish_reason"].is_null()) finish[c["index"]] = c["finish_reason"];
    }
  }
  EXPECT_EQ(text, (std::map<int, std::string>{
                      {0, "aHello"}, {1, "aHello"}, {2, "bbHello"}, {3, "bbHello"}}));
  EXPECT_EQ(finish.size(), 4u);
  // One choice refused: the request is refused with its status, and the others end.
  backend_.fail_suffix = "-1";
  backend_.gap = absl::Milliseconds(20);
  backend_.text = std::string(50, 'x');
  backend_.cancelled = false;
  r = Post("/v1/completions", {{"prompt", "Hi"}, {"n", 2}});
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_NE(Error(r)["message"].get<std::string>().find("no room"), std::string::npos) << r.body;
  EXPECT_TRUE(backend_.cancelled.load());  // the first choice did not run to its end
  // Too many choices for the server: a 400 naming n, before any generation.
  const int calls = backend_.calls.load();
  r = Post("/v1/completions", {{"prompt", "Hi"}, {"n", 65}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Error(r)["param"], "n");
  EXPECT_EQ(backend_.calls.load(), calls);
}

TEST_F(HttpFrontTest, StopStringEndsTheRequest) {
  StartFront();
  backend_.text = "ab\ncdefghijklmnopqrstuvwxyz";
  backend_.gap = absl::Milliseconds(20);
  Reply r = Post("/v1/completions", {{"prompt", "Hi"}, {"stop", "\n"}});
  ASSERT_EQ(r.status, 200);
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["text"], "ab");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(backend_.cancelled.load());  // the rest was not generated
  EXPECT_TRUE(backend_.satisfied.load());  // ... and the coordinator counts it as finished
  // Streamed, too.
  backend_.cancelled = false;
  backend_.satisfied = false;
  r = Post("/v1/completions", {{"prompt", "Hi"}, {"stop", "\n"}, {"stream", true}});
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("\"finish_reason\":\"stop\""), std::string::npos) << r.body;
  EXPECT_TRUE(backend_.cancelled.load());
  EXPECT_TRUE(backend_.satisfied.load());
}

TEST_F(HttpFrontTest, DisconnectMidStreamCancelsTheRequest) {
  StartFront();
  backend_.text = std::string(2000, 'x');
  backend_.gap = absl::Milliseconds(5);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(front_->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string body = R"({"prompt": "Hi", "stream": true, "max_tokens": 60})";
  const std::string req = absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
                                       "Content-Length: ", body.size(), "\r\n\r\n", body);
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  char buf[4096];
  ASSERT_GT(read(fd, buf, sizeof(buf)), 0);
  close(fd);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!backend_.cancelled.load() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(backend_.cancelled.load());
  EXPECT_FALSE(backend_.satisfied.load());  // a disconnect is a real cancellation
  ExpectMetricsSoon({"duet_http_client_disconnects_total 1", "duet_http_active_generations 0"});
}

// Not streamed: nothing is written to the client until the end, so only reading the socket
// shows that it has gone; the request must still be cancelled, not run to its end.
TEST_F(HttpFrontTest, DisconnectBeforeANonStreamedAnswerCancelsTheRequest) {
  StartFront();
  backend_.text = std::string(2000, 'x');  // 10 s at 5 ms a token
  backend_.gap = absl::Milliseconds(5);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(front_->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string body = R"({"prompt": "Hi", "max_tokens": 60})";
  const std::string req = absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
                                       "Content-Length: ", body.size(), "\r\n\r\n", body);
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  while (backend_.calls.load() == 0) absl::SleepFor(absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time closed = absl::Now();
  close(fd);
  const absl::Time deadline = closed + absl::Seconds(5);
  while (!backend_.cancelled.load() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(backend_.cancelled.load()) << "the request ran on after its client had gone";
  EXPECT_LT(absl::Now() - closed, absl::Seconds(2));
  EXPECT_FALSE(backend_.satisfied.load());
  ExpectMetricsSoon({"duet_http_client_disconnects_total 1", "duet_http_active_generations 0"});
}

}  // namespace
}  // namespace duet::http
