// `duet serve --colocated` as a real process, over the client API: the same tokens as the
// in-process engine and as a disaggregated loopback cluster (invariant 1), the same errors as
// the coordinator for bad input, RequestTimings filled, a cancel (client or Cancel RPC)
// mid-stream gives every KV block back (invariant 3, seen through Health), an HTTP client that
// leaves before its non-streamed answer cancels its request, and /metrics (--node_metrics) moves
// with requests.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/engine/local_engine.h"
#include "common/model/synthetic_model.h"
#include "duet/v1/client.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "proto/channel.h"
#include "proto/sampling_convert.h"
#include "proto/status_util.h"
#include "tests/integration/http_exchange.h"
#include "tests/integration/serve_process.h"

#ifndef DUET_BIN
#error "DUET_BIN must point at the duet binary"
#endif

namespace duet {
namespace {

namespace fs = std::filesystem;
using testing::ServeProcess;

struct Result {
  absl::Status status;
  std::vector<int32_t> ids;
  v1::RequestTimings timings;
  int32_t prompt_tokens = 0;
};

Result Generate(v1::Generation::Stub& stub, const v1::GenerateRequest& req,
                std::function<void(grpc::ClientContext&, int)> on_token = nullptr) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, absl::Seconds(120));
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse r;
  Result out;
  while (reader->Read(&r)) {
    if (r.has_token()) out.ids.push_back(r.token_id());
    if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      out.timings = r.timings();
      out.prompt_tokens = r.prompt_tokens();
    }
    if (on_token && r.has_token()) on_token(ctx, static_cast<int>(out.ids.size()));
  }
  out.status = rpc::FromGrpcStatus(reader->Finish());
  return out;
}

v1::GenerateRequest Request(const std::vector<int32_t>& prompt, const v1::SamplingParams& s,
                            const std::string& id = "") {
  v1::GenerateRequest req;
  req.set_request_id(id);
  req.mutable_token_ids()->mutable_ids()->Assign(prompt.begin(), prompt.end());
  *req.mutable_sampling() = s;
  return req;
}

v1::HealthResponse Health(v1::Generation::Stub& stub) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, absl::Seconds(2));
  v1::HealthResponse h;
  (void)stub.Health(&ctx, v1::HealthRequest(), &h);
  return h;
}

// Waits (bounded) until Health reports no request and every block free.
::testing::AssertionResult EverythingFree(v1::Generation::Stub& stub) {
  v1::HealthResponse h;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    h = Health(stub);
    bool free = h.ready() && h.running_requests() == 0 && h.nodes_size() > 0;
    for (const v1::NodeStatus& n : h.nodes()) {
      free =
          free && n.load().total_blocks() > 0 && n.load().free_blocks() == n.load().total_blocks();
    }
    if (free) return ::testing::AssertionSuccess();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return ::testing::AssertionFailure() << "not everything was freed: " << h.DebugString();
}

class ColocatedServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ =
        (fs::temp_directory_path() / absl::StrCat("duet_colocated_test_", getpid())).string();
    ASSERT_TRUE(model::WriteSyntheticModel("tiny", 3, model_dir_).ok());
  }
  static void TearDownTestSuite() { fs::remove_all(model_dir_); }

  static std::vector<std::string> ColocatedFlags() {
    return {"--colocated",           "--model=" + model_dir_,
            "--threads=1",           "--kv_cache_bytes=16777216",
            "--max_batch_tokens=64", "--max_running=16"};
  }
  static std::vector<std::string> ClusterFlags() {
    return {"--loopback",
            "--prefill=1",
            "--decode=1",
            "--model=" + model_dir_,
            "--transport=shm",
            "--threads=1",
            "--kv_cache_bytes=16777216"};
  }
  std::vector<int32_t> Prompt(int n, int salt) {
    std::vector<int32_t> p(n);
    for (int i = 0; i < n; ++i) p[i] = (i * 31 + salt * 17 + 3) % 256;
    return p;
  }
  std::vector<int32_t> Reference(const std::vector<int32_t>& prompt,
                                 const model::SamplingParams& params) {
    if (!engine_) {
      auto e = model::LocalEngine::Load(
          model_dir_,
          {.device = compute::Device::kCpu, .num_threads = 1, .kv_cache_bytes = 64 << 20});
      EXPECT_TRUE(e.ok()) << e.status();
      engine_ = std::move(*e);
    }
    auto r = engine_->Generate(prompt, params);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->generated_ids : std::vector<int32_t>();
  }

  static std::string model_dir_;
  std::unique_ptr<model::LocalEngine> engine_;
};
std::string ColocatedServeTest::model_dir_;

// Invariant 1: concurrent greedy and seeded requests (prompts chunked under a 64-token budget,
// sharing steps with running decodes) give the in-process engine's tokens and the
// disaggregated cluster's.
TEST_F(ColocatedServeTest, TokenExactAgainstOneProcessAndTheCluster) {
  ServeProcess colocated(DUET_BIN, ColocatedFlags());
  ASSERT_TRUE(colocated.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(colocated.address()));
  const std::vector<int> lengths = {1, 15, 16, 17, 100, 700};
  std::vector<v1::SamplingParams> sampling;
  std::vector<model::SamplingParams> params;
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < lengths.size(); ++i) {
    for (int seeded = 0; seeded < 2; ++seeded) {
      v1::SamplingParams s;
      s.set_max_tokens(12);
      s.set_ignore_eos(true);
      model::SamplingParams p{.max_tokens = 12, .ignore_eos = true};
      if (seeded) {
        s.set_temperature(0.8f);
        s.set_top_p(0.9f);
        s.set_seed(1234 + i);
        p.temperature = 0.8f;
        p.top_p = 0.9f;
        p.seed = 1234 + i;
      }
      sampling.push_back(s);
      params.push_back(p);
      prompts.push_back(Prompt(lengths[i], static_cast<int>(i)));
    }
  }
  auto run_all = [&](v1::Generation::Stub& s) {
    std::vector<Result> results(prompts.size());
    std::vector<std::thread> threads;
    for (size_t k = 0; k < prompts.size(); ++k) {
      threads.emplace_back([&, k] { results[k] = Generate(s, Request(prompts[k], sampling[k])); });
    }
    for (auto& t : threads) t.join();
    return results;
  };
  std::vector<Result> local = run_all(*stub);
  for (size_t k = 0; k < prompts.size(); ++k) {
    ASSERT_TRUE(local[k].status.ok()) << "request " << k << ": " << local[k].status;
    EXPECT_EQ(local[k].ids, Reference(prompts[k], params[k])) << "request " << k;
    EXPECT_EQ(local[k].prompt_tokens, static_cast<int32_t>(prompts[k].size()));
  }
  EXPECT_TRUE(EverythingFree(*stub));

  ServeProcess cluster(DUET_BIN, ClusterFlags());
  ASSERT_TRUE(cluster.ready());
  auto cstub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  std::vector<Result> disaggregated = run_all(*cstub);
  for (size_t k = 0; k < prompts.size(); ++k) {
    ASSERT_TRUE(disaggregated[k].status.ok()) << disaggregated[k].status;
    EXPECT_EQ(local[k].ids, disaggregated[k].ids) << "request " << k;
  }
}

// 48 concurrent requests (about 500 blocks of prompts) on a pool of 128 blocks: admission waits
// for room (and a growing decode may preempt a prefill), yet every request gets the engine's
// tokens and nothing is left held.
TEST_F(ColocatedServeTest, SmallPoolUnderLoadIsTokenExactAndLeavesNothing) {
  std::vector<std::string> flags = ColocatedFlags();
  flags.push_back("--kv_cache_bytes=1048576");  // the last value of a flag wins
  flags.push_back("--max_batch_tokens=16");     // long prompts take many steps
  ServeProcess colocated(DUET_BIN, flags);
  ASSERT_TRUE(colocated.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(colocated.address()));
  const v1::HealthResponse h = Health(*stub);
  ASSERT_EQ(h.nodes_size(), 1);
  EXPECT_EQ(h.nodes(0).load().total_blocks(), 128);
  constexpr int kRequests = 48;
  std::vector<Result> results(kRequests);
  std::vector<std::thread> threads;
  auto prompt_of = [&](int i) { return Prompt(1 + (i * 37) % 300, i); };
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      v1::SamplingParams s;
      s.set_max_tokens(4 + i % 9);
      s.set_ignore_eos(true);
      results[i] = Generate(*stub, Request(prompt_of(i), s));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << "request " << i << ": " << results[i].status;
    EXPECT_EQ(results[i].ids,
              Reference(prompt_of(i), {.max_tokens = 4 + i % 9, .ignore_eos = true}))
        << "request " << i;
  }
  EXPECT_TRUE(EverythingFree(*stub));
}

// The final message carries the phases: no transfer, a decode admission, a TTFT that covers
// queueing and prefill.
TEST_F(ColocatedServeTest, FillsRequestTimings) {
  ServeProcess colocated(DUET_BIN, ColocatedFlags());
  ASSERT_TRUE(colocated.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(colocated.address()));
  v1::SamplingParams s;
  s.set_max_tokens(6);
  s.set_ignore_eos(true);
  Result r = Generate(*stub, Request(Prompt(300, 1), s));
  ASSERT_TRUE(r.status.ok()) << r.status;
  const v1::RequestTimings& t = r.timings;
  EXPECT_GT(t.prefill_compute_us(), 0);
  EXPECT_GE(t.time_to_first_token_us(), t.prefill_compute_us() + t.queue_us());
  EXPECT_EQ(t.transfer_tail_us(), 0);
  EXPECT_EQ(t.reserve_us(), 0);
  EXPECT_GT(t.decode_admission_us(), 0);
  EXPECT_GT(t.decode_us(), 0);
  EXPECT_EQ(t.prefill_attempts(), 1);
}

// The value of one series ("name{label=\"v\"}") in Prometheus text scraped from `url`
// (http://HOST:PORT/metrics); -1 when the scrape fails or the series is absent.
double Scrape(const std::string& url, const std::string& series) {
  int port = 0;
  char host[64];
  if (std::sscanf(url.c_str(), "http://%63[^:]:%d/metrics", host, &port) != 2) return -1;
  httplib::Client client(host, port);
  client.set_read_timeout(5, 0);
  httplib::Result res = client.Get("/metrics");
  if (!res || res->status != 200) return -1;
  std::istringstream in(res->body);
  for (std::string line; std::getline(in, line);) {
    if (absl::StartsWith(line, series + " ")) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

// --node_metrics: "metrics colocated-0 URL" before "ready"; counters move with a request, and
// the gauges show the pool whole again at rest.
TEST_F(ColocatedServeTest, ServesMetricsThatMoveWithRequests) {
  std::vector<std::string> flags = ColocatedFlags();
  flags.push_back("--node_metrics");
  ServeProcess colocated(DUET_BIN, flags);
  ASSERT_TRUE(colocated.ready());
  const std::string url = colocated.metrics_url("colocated-0");
  ASSERT_FALSE(url.empty()) << "no \"metrics colocated-0 URL\" line";
  const std::string ok = "duet_colocated_requests_total{outcome=\"ok\"}";
  const std::string cancelled = "duet_colocated_requests_total{outcome=\"cancelled\"}";
  const std::string tokens = "duet_colocated_generated_tokens_total";
  const std::string total = "duet_colocated_kv_blocks{state=\"total\"}";
  const std::string free = "duet_colocated_kv_blocks{state=\"free\"}";
  const std::string evictable = "duet_colocated_kv_blocks{state=\"evictable\"}";
  EXPECT_EQ(Scrape(url, ok), 0);
  EXPECT_EQ(Scrape(url, tokens), 0);
  EXPECT_GT(Scrape(url, total), 0);
  EXPECT_EQ(Scrape(url, free), Scrape(url, total));
  EXPECT_EQ(Scrape(url, "duet_colocated_queue{what=\"running_requests\"}"), 0);
  EXPECT_EQ(Scrape(url, "duet_colocated_queue{what=\"waiting_requests\"}"), 0);

  auto stub = v1::Generation::NewStub(rpc::MakeChannel(colocated.address()));
  v1::SamplingParams s;
  s.set_max_tokens(7);
  s.set_ignore_eos(true);
  Result r = Generate(*stub, Request(Prompt(40, 1), s));
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(r.ids.size(), 7u);
  EXPECT_EQ(Scrape(url, ok), 1);
  EXPECT_EQ(Scrape(url, tokens), 7);
  // A request cancelled mid-stream counts as cancelled; its blocks come back.
  s.set_max_tokens(3000);
  bool running_seen = false;
  r = Generate(*stub, Request(Prompt(40, 2), s), [&](grpc::ClientContext& ctx, int n) {
    if (n == 2) {
      running_seen = Scrape(url, "duet_colocated_queue{what=\"running_requests\"}") == 1 &&
                     Scrape(url, free) < Scrape(url, total);
    }
    if (n == 3) ctx.TryCancel();
  });
  EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled) << r.status;
  EXPECT_TRUE(running_seen);
  ASSERT_TRUE(EverythingFree(*stub));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Scrape(url, cancelled) != 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(Scrape(url, cancelled), 1);
  EXPECT_EQ(Scrape(url, ok), 1);
  // Free, or kept in the prefix cache and unused.
  EXPECT_EQ(Scrape(url, free) + Scrape(url, evictable), Scrape(url, total));
}

// A pool too small for its running decodes (20 blocks; four requests of 40 prompt tokens that grow
// to 10 blocks each): the server preempts the newest running request, requeues it and resumes it
// by recomputing its prompt and the tokens it already streamed, as the decode node does. Every
// request finishes with the single-process tokens (greedy and seeded, with and without
// penalties), preemptions are counted, and nothing is held afterwards. The server is stopped
// while the four requests are sent, so that all four are admitted together and grow together
// whatever the machine's load: run one after another, they would fit.
TEST_F(ColocatedServeTest, FullPoolPreemptsRunningDecodesAndResumesThemTokenExact) {
  std::vector<std::string> flags = ColocatedFlags();
  flags.push_back("--kv_cache_bytes=163840");  // 20 blocks of the tiny model
  flags.push_back("--node_metrics");
  ServeProcess colocated(DUET_BIN, flags);
  ASSERT_TRUE(colocated.ready());
  const std::string url = colocated.metrics_url("colocated-0");
  ASSERT_FALSE(url.empty()) << "no \"metrics colocated-0 URL\" line";
  const std::string preemptions = "duet_colocated_preemptions_total";
  EXPECT_EQ(Scrape(url, preemptions), 0);
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(colocated.address()));
  ASSERT_EQ(Health(*stub).nodes(0).load().total_blocks(), 20);
  auto params = [](int i) {
    model::SamplingParams p{.max_tokens = 120, .ignore_eos = true};
    if (i % 2) {
      p.temperature = 0.9f;
      p.seed = 11 + i;
    }
    if (i >= 2) {  // the resumed prefill counts the streamed tokens as output
      p.repetition_penalty = 1.2f;
      p.presence_penalty = 0.5f;
      p.frequency_penalty = 0.3f;
      p.min_p = 0.02f;
    }
    return p;
  };
  std::vector<Result> results(4);
  std::vector<std::thread> threads;
  const pid_t pid = colocated.pid_of("colocated-0");
  ASSERT_GT(pid, 0);
  kill(pid, SIGSTOP);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = Generate(*stub, Request(Prompt(40, i), rpc::ToProto(params(i)))); });
  }
  absl::SleepFor(absl::Milliseconds(300));  // the four calls wait in the stopped server's socket
  kill(pid, SIGCONT);
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status;
    EXPECT_EQ(results[i].ids, Reference(Prompt(40, i), params(i))) << i;
  }
  EXPECT_GT(Scrape(url, preemptions), 0) << "the pool was expected to force a preemption";
  EXPECT_TRUE(EverythingFree(*stub));
}

// Bad input gets the coordinator's status, code and message alike.
TEST_F(ColocatedServeTest, BadInputGetsTheCoordinatorsErrors) {
  ServeProcess colocated(DUET_BIN, ColocatedFlags());
  ServeProcess cluster(DUET_BIN, ClusterFlags());
  ASSERT_TRUE(colocated.ready());
  ASSERT_TRUE(cluster.ready());
  auto a = v1::Generation::NewStub(rpc::MakeChannel(colocated.address()));
  auto b = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  v1::SamplingParams ok;
  ok.set_max_tokens(2);
  std::vector<v1::GenerateRequest> bad;
  bad.push_back(Request({}, ok));
  bad.push_back(Request({1, 2, 400}, ok));
  bad.push_back(Request(Prompt(4096, 1), ok));
  v1::SamplingParams neg = ok;
  neg.set_temperature(-1.f);
  bad.push_back(Request({1, 2}, neg));
  v1::SamplingParams many = ok;
  many.set_logprobs(50);
  bad.push_back(Request({1, 2}, many));
  v1::SamplingParams stop = ok;
  stop.add_stop_token_ids(100000);
  bad.push_back(Request({1, 2}, stop));
  for (size_t i = 0; i < bad.size(); ++i) {
    Result ra = Generate(*a, bad[i]);
    Result rb = Generate(*b, bad[i]);
    EXPECT_EQ(ra.status.code(), absl::StatusCode::kInvalidArgument) << i << ": " << ra.status;
    EXPECT_EQ(ra.status, rb.status) << "request " << i;
  }
  EXPECT_TRUE(EverythingFree(*a));
}

// A client that cancels mid-stream, and a Cancel RPC mid-stream, both end the request and
// return every block; Cancel of a finished request finds nothing.
TEST_F(ColocatedServeTest, CancelMidStreamFreesEveryBlock) {
  ServeProcess colocated(DUET_BIN, ColocatedFlags());
  ASSERT_TRUE(colocated.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(colocated.address()));
  v1::SamplingParams s;
  s.set_max_tokens(3000);
  s.set_ignore_eos(true);
  bool saw_blocks_held = false;
  Result r = Generate(*stub, Request(Prompt(200, 1), s), [&](grpc::ClientContext& ctx, int n) {
    if (n == 3) {
      v1::HealthResponse h = Health(*stub);
      saw_blocks_held =
          h.nodes_size() == 1 && h.nodes(0).load().free_blocks() < h.nodes(0).load().total_blocks();
    }
    if (n == 5) ctx.TryCancel();
  });
  EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled) << r.status;
  EXPECT_TRUE(saw_blocks_held);
  EXPECT_TRUE(EverythingFree(*stub));

  std::atomic<int> tokens{0};
  std::thread streamer([&] {
    r = Generate(*stub, Request(Prompt(300, 2), s, "to-cancel"),
                 [&](grpc::ClientContext&, int n) { tokens = n; });
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (tokens.load() < 3 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  v1::CancelRequest creq;
  creq.set_request_id("to-cancel");
  v1::CancelResponse cresp;
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(ctx, absl::Seconds(5));
    ASSERT_TRUE(stub->Cancel(&ctx, creq, &cresp).ok());
  }
  EXPECT_TRUE(cresp.found());
  streamer.join();
  EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled) << r.status;
  EXPECT_LT(r.ids.size(), 3000u);
  EXPECT_TRUE(EverythingFree(*stub));
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(ctx, absl::Seconds(5));
    ASSERT_TRUE(stub->Cancel(&ctx, creq, &cresp).ok());
  }
  EXPECT_FALSE(cresp.found());
}

// A non-streamed HTTP completion whose client goes away is cancelled on the real server, not
// run to its end: the front reads the socket while the request runs (nothing is written to it
// until the end), so it sees the close at once and the scheduler frees the request's blocks.
TEST_F(ColocatedServeTest, OpenAiRequestWhoseClientLeavesIsCancelled) {
  std::vector<std::string> flags = ColocatedFlags();
  flags.push_back("--http_port=0");
  ServeProcess colocated(DUET_BIN, flags);
  ASSERT_TRUE(colocated.ready());
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(colocated.http_url().substr(17), &port)) << colocated.http_url();
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(colocated.address()));

  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string body =
      nlohmann::json{{"prompt", Prompt(200, 7)}, {"max_tokens", 3000}, {"ignore_eos", true}}.dump();
  const std::string req = absl::StrCat(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
      "Content-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  // Running (its blocks held), then the client leaves.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  bool running = false;
  while (!running && absl::Now() < deadline) {
    const v1::HealthResponse h = Health(*stub);
    running = h.running_requests() == 1 && h.nodes_size() == 1 &&
              h.nodes(0).load().free_blocks() < h.nodes(0).load().total_blocks();
    if (!running) absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(running);
  close(fd);
  EXPECT_TRUE(EverythingFree(*stub));
  // It ended as a cancelled request, well before its 3000 tokens.
  const testing::Reply m = testing::Exchange(port, "GET", "/metrics", "");
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("duet_colocated_requests_total{outcome=\"cancelled\"} 1"),
            std::string::npos)
      << m.body;
  EXPECT_NE(m.body.find("duet_http_client_disconnects_total 1"), std::string::npos) << m.body;
  double tokens = -1;
  for (absl::string_view line : absl::StrSplit(m.body, '\n')) {
    if (absl::ConsumePrefix(&line, "duet_colocated_generated_tokens_total ")) {
      ASSERT_TRUE(absl::SimpleAtod(line, &tokens)) << line;
    }
  }
  EXPECT_GE(tokens, 0) << m.body;
  EXPECT_LT(tokens, 3000) << m.body;
}

// The OpenAI-compatible HTTP API over the colocated server (the coordinator's front, with the
// colocated server as its backend): a greedy /v1/completions answers the tokens of the gRPC
// Generate (same count, logprob and text per token), and /v1/models and /health answer.
TEST_F(ColocatedServeTest, OpenAiCompletionsEqualGrpcGenerate) {
  std::vector<std::string> flags = ColocatedFlags();
  flags.push_back("--http_port=0");
  ServeProcess colocated(DUET_BIN, flags);
  ASSERT_TRUE(colocated.ready());
  ASSERT_TRUE(absl::StartsWith(colocated.http_url(), "http://127.0.0.1:")) << colocated.http_url();
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(colocated.http_url().substr(17), &port)) << colocated.http_url();
  const std::vector<int32_t> prompt = Prompt(24, 5);

  auto stub = v1::Generation::NewStub(rpc::MakeChannel(colocated.address()));
  v1::SamplingParams s;
  s.set_max_tokens(10);
  s.set_ignore_eos(true);
  v1::GenerateRequest req = Request(prompt, s);
  req.set_return_text(true);
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, absl::Seconds(60));
  auto reader = stub->Generate(&ctx, req);
  std::vector<float> logprobs;
  std::vector<std::string> pieces;
  for (v1::GenerateResponse r; reader->Read(&r);) {
    if (!r.has_token()) continue;
    logprobs.push_back(r.logprob());
    pieces.push_back(r.text());
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(logprobs.size(), 10u);

  const nlohmann::json body = {{"prompt", prompt},
                               {"max_tokens", 10},
                               {"temperature", 0},
                               {"ignore_eos", true},
                               {"logprobs", 0}};
  const testing::Reply r = testing::Exchange(port, "POST", "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.head << "\n" << r.body;
  const nlohmann::json j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 10) << r.body;
  EXPECT_EQ(j["usage"]["prompt_tokens"], 24) << r.body;
  // Per token: the same logprob, and the same text (where it is ASCII: the front repairs a
  // piece that ends inside a UTF-8 character, as JSON must).
  const nlohmann::json& logprobs_json = j["choices"][0]["logprobs"];
  const nlohmann::json& lps = logprobs_json["token_logprobs"];
  const nlohmann::json& tokens = logprobs_json["tokens"];
  ASSERT_EQ(lps.size(), logprobs.size()) << r.body;
  ASSERT_EQ(tokens.size(), pieces.size()) << r.body;
  for (size_t i = 0; i < logprobs.size(); ++i) {
    EXPECT_NEAR(lps[i].get<double>(), logprobs[i], 1e-6) << "token " << i;
    if (std::all_of(pieces[i].begin(), pieces[i].end(),
                    [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
      EXPECT_EQ(tokens[i].get<std::string>(), pieces[i]) << "token " << i;
    }
  }
  const testing::Reply models = testing::Exchange(port, "GET", "/v1/models", "");
  EXPECT_EQ(models.status, 200) << models.body;
  EXPECT_NE(models.body.find(fs::path(model_dir_).filename().string()), std::string::npos)
      << models.body;
  EXPECT_EQ(testing::Exchange(port, "GET", "/health", "").status, 200);
  EXPECT_TRUE(EverythingFree(*stub));
}

// The disk tier (--kv_disk_path): a prompt whose blocks the pool evicted for others comes back
// from the disk, counted as cached, with the same tokens; a clean stop writes what the pool
// still caches and a restarted server finds all of it; a damaged file is a miss, never wrong
// tokens.
TEST_F(ColocatedServeTest, DiskTierServesEvictedPrefixesAndSurvivesARestart) {
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("duet_kv_disk_", getpid());
  fs::remove_all(dir);
  std::vector<std::string> flags = ColocatedFlags();
  flags.push_back("--kv_cache_bytes=1048576");  // 128 blocks of 16 tokens
  flags.push_back("--kv_disk_path=" + dir.string());
  flags.push_back("--kv_disk_bytes=33554432");
  flags.push_back("--node_metrics");
  const std::string tier_hits = "duet_colocated_prefix_cache_tier_hits_total";
  v1::SamplingParams s;
  s.set_max_tokens(4);
  s.set_ignore_eos(true);
  const std::vector<int32_t> a = Prompt(300, 100);  // 18 full blocks may hit
  const std::vector<int32_t> want = Reference(a, {.max_tokens = 4, .ignore_eos = true});
  {
    ServeProcess colocated(DUET_BIN, flags);
    ASSERT_TRUE(colocated.ready());
    auto stub = v1::Generation::NewStub(rpc::MakeChannel(colocated.address()));
    const std::string url = colocated.metrics_url("colocated-0");
    Result first = Generate(*stub, Request(a, s));
    ASSERT_TRUE(first.status.ok()) << first.status;
    EXPECT_EQ(first.ids, want);
    EXPECT_EQ(first.timings.prefill_cached_tokens(), 0);
    // 8 other prompts of 19 blocks each need more than the pool: a's blocks are evicted.
    for (int i = 0; i < 8; ++i) {
      Result other = Generate(*stub, Request(Prompt(300, 200 + i), s));
      ASSERT_TRUE(other.status.ok()) << i << ": " << other.status;
    }
    EXPECT_GT(Scrape(url, "duet_kv_disk_written_blocks_total"), 0);
    Result again = Generate(*stub, Request(a, s));
    ASSERT_TRUE(again.status.ok()) << again.status;
    EXPECT_EQ(again.ids, want);
    EXPECT_EQ(again.timings.prefill_cached_tokens(), 288);
    EXPECT_GT(Scrape(url, tier_hits), 0) << "a's blocks were meant to come from the disk";
    EXPECT_TRUE(EverythingFree(*stub));
    EXPECT_EQ(colocated.Stop(absl::Seconds(30)), 0);
  }
  {
    // A restart finds the tier: every full block of a comes from it.
    ServeProcess colocated(DUET_BIN, flags);
    ASSERT_TRUE(colocated.ready());
    auto stub = v1::Generation::NewStub(rpc::MakeChannel(colocated.address()));
    const std::string url = colocated.metrics_url("colocated-0");
    EXPECT_GT(Scrape(url, "duet_kv_disk_restored_blocks"), 18);
    Result r = Generate(*stub, Request(a, s));
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.ids, want);
    EXPECT_EQ(r.timings.prefill_cached_tokens(), 288);
    EXPECT_EQ(Scrape(url, tier_hits), 288);
    EXPECT_EQ(colocated.Stop(absl::Seconds(30)), 0);
  }
  {
    // Other weights of the same architecture (the same prefix-cache seed): nothing on the disk
    // is theirs.
    const fs::path other = dir / "other-model";
    ASSERT_TRUE(model::WriteSyntheticModel("tiny", 4, other.string()).ok());
    std::vector<std::string> other_flags = flags;
    other_flags.push_back("--model=" + other.string());
    ServeProcess colocated(DUET_BIN, other_flags);
    ASSERT_TRUE(colocated.ready());
    auto stub = v1::Generation::NewStub(rpc::MakeChannel(colocated.address()));
    EXPECT_EQ(Scrape(colocated.metrics_url("colocated-0"), "duet_kv_disk_restored_blocks"), 0);
    Result r = Generate(*stub, Request(a, s));
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.timings.prefill_cached_tokens(), 0);
    EXPECT_EQ(colocated.Stop(absl::Seconds(30)), 0);
    fs::remove_all(other);
  }
  {
    // Every 4 KiB page of the file damaged: nothing is a hit, the tokens are the same.
    const fs::path file = dir / "colocated-0.kv";
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    const int64_t size = static_cast<int64_t>(fs::file_size(file));
    for (int64_t off = 100; off < size; off += 4096) {
      char c = 0;
      f.seekg(off);
      f.get(c);
      f.seekp(off);
      f.put(static_cast<char>(c ^ 0x5a));
    }
    ASSERT_TRUE(f.good());
    f.close();
    ServeProcess colocated(DUET_BIN, flags);
    ASSERT_TRUE(colocated.ready());
    auto stub = v1::Generation::NewStub(rpc::MakeChannel(colocated.address()));
    EXPECT_EQ(Scrape(colocated.metrics_url("colocated-0"), "duet_kv_disk_restored_blocks"), 0);
    Result r = Generate(*stub, Request(a, s));
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.ids, want);
    EXPECT_EQ(r.timings.prefill_cached_tokens(), 0);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace duet
