// Loopback cluster tests: `duet serve --loopback` starts a coordinator, prefill and decode
// nodes as real processes; these tests talk to it over gRPC and check the invariants of
// docs/design.md §5: token-exact against the in-process engine (1), no leaks (3), deadlines (5),
// layouts (6).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/model/local_engine.h"
#include "common/model/synthetic_model.h"
#include "duet/v1/client.grpc.pb.h"
#include "proto/channel.h"
#include "proto/sampling_convert.h"
#include "tests/integration/child_process.h"
#include "tests/integration/serve_process.h"

#ifndef DUET_BIN
#error "DUET_BIN must point at the duet binary"
#endif

namespace duet {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;
using testing::ServeProcess;

// `duet serve --loopback` flags for a cluster of `prefill` and `decode` nodes on `transport`.
std::vector<std::string> ClusterFlags(const std::string& model_dir, const std::string& transport,
                                      int prefill, int decode,
                                      const std::vector<std::string>& extra = {}) {
  std::vector<std::string> flags = {"--loopback",
                                    absl::StrCat("--prefill=", prefill),
                                    absl::StrCat("--decode=", decode),
                                    "--model=" + model_dir,
                                    "--transport=" + transport,
                                    "--threads=1",
                                    "--kv_cache_bytes=16777216",
                                    "--heartbeat_timeout_ms=1500"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

struct Result {
  absl::Status status;
  std::vector<int32_t> ids;
  v1::RequestTimings timings;
};

Result Generate(v1::Generation::Stub& stub, const std::vector<int32_t>& prompt,
                const v1::SamplingParams& sampling, absl::Duration timeout = absl::Seconds(60),
                std::function<void(grpc::ClientContext&, int)> on_token = nullptr) {
  v1::GenerateRequest req;
  req.mutable_token_ids()->mutable_ids()->Assign(prompt.begin(), prompt.end());
  *req.mutable_sampling() = sampling;
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, timeout);
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse r;
  Result out;
  while (reader->Read(&r)) {
    if (r.has_token()) out.ids.push_back(r.token_id());
    if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) out.timings = r.timings();
    if (on_token && r.has_token()) on_token(ctx, static_cast<int>(out.ids.size()));
  }
  grpc::Status s = reader->Finish();
  out.status = s.ok()
                   ? absl::OkStatus()
                   : absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return out;
}

v1::HealthResponse Health(v1::Generation::Stub& stub) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, absl::Seconds(2));
  v1::HealthResponse h;
  (void)stub.Health(&ctx, v1::HealthRequest(), &h);
  return h;
}

// Waits (bounded) until no request is tracked, the directory is empty and every decode node's
// heartbeat reports all blocks free.
::testing::AssertionResult EverythingFree(v1::Generation::Stub& stub,
                                          absl::Duration within = absl::Seconds(10)) {
  v1::HealthResponse h;
  const absl::Time deadline = absl::Now() + within;
  while (absl::Now() < deadline) {
    h = Health(stub);
    bool free = h.running_requests() == 0 && h.directory_entries() == 0;
    for (const v1::NodeStatus& n : h.nodes()) {
      free = free && n.load().free_blocks() == n.load().total_blocks();
    }
    if (free) return ::testing::AssertionSuccess();
    absl::SleepFor(absl::Milliseconds(100));
  }
  return ::testing::AssertionFailure() << "not everything was freed: " << h.DebugString();
}

class ClusterTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    model_dir_ =
        (fs::temp_directory_path() / absl::StrCat("duet_cluster_test_", getpid())).string();
    ASSERT_TRUE(model::WriteSyntheticModel("tiny", 3, model_dir_).ok());
  }
  static void TearDownTestSuite() { fs::remove_all(model_dir_); }

  std::vector<int32_t> Prompt(int n, int salt) {
    std::vector<int32_t> p(n);
    for (int i = 0; i < n; ++i) p[i] = (i * 31 + salt * 17 + 3) % 256;
    return p;
  }
  // What one process (`duet generate`'s engine) gives, with its KV in `kv_dtype`.
  std::vector<int32_t> Reference(const std::vector<int32_t>& prompt,
                                 const model::SamplingParams& params,
                                 const std::string& kv_dtype = "auto") {
    std::unique_ptr<model::LocalEngine>& engine = engines_[kv_dtype];
    if (!engine) {
      auto e = model::LocalEngine::Load(
          model_dir_,
          {.device = "cpu", .num_threads = 1, .kv_cache_bytes = 64 << 20, .kv_dtype = kv_dtype});
      EXPECT_TRUE(e.ok()) << e.status();
      if (!e.ok()) return {};
      engine = std::move(*e);
    }
    auto r = engine->Generate(prompt, params);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->generated_ids : std::vector<int32_t>();
  }

  void ExpectTokenExactAndEverythingFree(const std::vector<std::string>& extra = {},
                                         const std::string& transport = "",
                                         const std::string& kv_dtype = "auto");

  static std::string model_dir_;
  std::map<std::string, std::unique_ptr<model::LocalEngine>> engines_;
};
std::string ClusterTest::model_dir_;

// Invariant 1: greedy and seeded tokens from a 2-prefill/2-decode cluster equal the in-process
// engine's, for prompt lengths crossing block boundaries, with requests running concurrently;
// afterwards nothing is held anywhere.
void ClusterTest::ExpectTokenExactAndEverythingFree(const std::vector<std::string>& extra,
                                                    const std::string& transport,
                                                    const std::string& kv_dtype) {
  std::vector<std::string> flags = extra;
  flags.push_back("--kv_dtype=" + kv_dtype);
  ServeProcess cluster(
      DUET_BIN, ClusterFlags(model_dir_, transport.empty() ? GetParam() : transport, 2, 2, flags));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  const std::vector<int> lengths = {1, 15, 16, 17, 100, 700, 2000};
  std::vector<std::thread> threads;
  std::vector<Result> results(lengths.size() * 2);
  for (size_t i = 0; i < lengths.size(); ++i) {
    for (int seeded = 0; seeded < 2; ++seeded) {
      threads.emplace_back([&, i, seeded] {
        v1::SamplingParams s;
        s.set_max_tokens(12);
        s.set_ignore_eos(true);
        if (seeded) {
          s.set_temperature(0.8f);
          s.set_top_p(0.9f);
          s.set_seed(1234 + i);
        }
        results[i * 2 + seeded] = Generate(*stub, Prompt(lengths[i], i), s);
      });
    }
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < lengths.size(); ++i) {
    for (int seeded = 0; seeded < 2; ++seeded) {
      const Result& r = results[i * 2 + seeded];
      ASSERT_TRUE(r.status.ok()) << "length " << lengths[i] << ": " << r.status;
      model::SamplingParams p{.max_tokens = 12, .ignore_eos = true};
      if (seeded) {
        p.temperature = 0.8f;
        p.top_p = 0.9f;
        p.seed = 1234 + i;
      }
      EXPECT_EQ(r.ids, Reference(Prompt(lengths[i], i), p, kv_dtype))
          << "length " << lengths[i] << (seeded ? " seeded" : " greedy") << ", KV " << kv_dtype;
      // The coordinator timed a real Reserve RPC to D (microseconds even on loopback).
      EXPECT_GT(r.timings.reserve_us(), 0) << r.timings.DebugString();
      EXPECT_GE(r.timings.queue_us(), r.timings.reserve_us()) << r.timings.DebugString();
    }
  }
  EXPECT_TRUE(EverythingFree(*stub));
}

TEST_P(ClusterTest, TokenExactAgainstOneProcess) { ExpectTokenExactAndEverythingFree(); }

// Prefix caching across the cluster: a chat's next turn (the conversation so far plus a new
// message) is routed where its prefix is cached, P computes only what its cache lacks, D
// receives only the blocks it does not hold, and the tokens (greedy and seeded) equal the
// in-process engine's; with caching off everything is computed and sent, with the same tokens.
TEST_P(ClusterTest, PrefixCacheHitsAreTokenExactAndSkipComputeAndTransfer) {
  for (bool cache : {true, false}) {
    SCOPED_TRACE(cache ? "cache on" : "cache off");
    ServeProcess cluster(
        DUET_BIN, ClusterFlags(model_dir_, GetParam(), 2, 2,
                               {absl::StrCat("--enable_prefix_caching=", cache ? "true" : "false"),
                                "--router=cache_aware"}));
    ASSERT_TRUE(cluster.ready());
    auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
    for (int seeded = 0; seeded < 2; ++seeded) {
      v1::SamplingParams s;
      s.set_max_tokens(8);
      s.set_ignore_eos(true);
      model::SamplingParams p{.max_tokens = 8, .ignore_eos = true};
      if (seeded) {
        s.set_temperature(0.8f);
        s.set_seed(99);
        p.temperature = 0.8f;
        p.seed = 99;
      }
      const std::vector<int32_t> a = Prompt(100, 40 + seeded);
      const Result r1 = Generate(*stub, a, s);
      ASSERT_TRUE(r1.status.ok()) << r1.status;
      EXPECT_EQ(r1.ids, Reference(a, p));
      EXPECT_EQ(r1.timings.prefill_cached_tokens(), 0);
      EXPECT_EQ(r1.timings.decode_cached_tokens(), 0);
      const int64_t block_bytes = r1.timings.kv_bytes_sent() / 7;  // 100 tokens: 7 blocks
      EXPECT_GT(block_bytes, 0);
      absl::SleepFor(absl::Milliseconds(300));  // the nodes' cache events reach the coordinator
      std::vector<int32_t> b = a;
      b.insert(b.end(), r1.ids.begin(), r1.ids.end());
      const std::vector<int32_t> more = Prompt(20, 60 + seeded);
      b.insert(b.end(), more.begin(), more.end());  // 128 tokens: 8 blocks
      const Result r2 = Generate(*stub, b, s);
      ASSERT_TRUE(r2.status.ok()) << r2.status;
      EXPECT_EQ(r2.ids, Reference(b, p));
      // P held the first prompt's 6 full blocks; D held 6 too (100 + 7 tokens with K/V).
      EXPECT_EQ(r2.timings.prefill_cached_tokens(), cache ? 96 : 0) << r2.timings.DebugString();
      EXPECT_EQ(r2.timings.decode_cached_tokens(), cache ? 96 : 0) << r2.timings.DebugString();
      EXPECT_EQ(r2.timings.kv_bytes_sent(), (cache ? 2 : 8) * block_bytes);
      absl::SleepFor(absl::Milliseconds(300));
      const Result r3 = Generate(*stub, b, s);  // the same prompt again
      ASSERT_TRUE(r3.status.ok()) << r3.status;
      EXPECT_EQ(r3.ids, r2.ids);
      EXPECT_EQ(r3.timings.prefill_cached_tokens(), cache ? 112 : 0) << r3.timings.DebugString();
      EXPECT_EQ(r3.timings.decode_cached_tokens(), cache ? 112 : 0) << r3.timings.DebugString();
      EXPECT_EQ(r3.timings.kv_bytes_sent(), (cache ? 1 : 8) * block_bytes);
    }
    EXPECT_TRUE(EverythingFree(*stub));
  }
}

// The same through the staging path (what a GPU pool needs), forced on cpu: prefill nodes copy
// each layer into a host mirror the transport exports and post it once the copy is done; decode
// nodes receive into a host mirror and copy it into the pool at admission.
TEST_P(ClusterTest, StagedKvIsTokenExactAndFreesEverything) {
  ExpectTokenExactAndEverythingFree({"--kv_staging=always"});
}

// Staging with all layers posted after the forward pass.
TEST_P(ClusterTest, StagedKvWithoutLayerPipeliningIsTokenExact) {
  ExpectTokenExactAndEverythingFree({"--kv_staging=always", "--no_layer_pipelining"});
}

// 64 concurrent requests of mixed lengths all complete; afterwards nothing is held anywhere.
TEST_P(ClusterTest, SixtyFourConcurrentRequestsLeaveNothingBehind) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, GetParam(), 2, 2));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  std::vector<std::thread> threads;
  std::vector<Result> results(64);
  for (int i = 0; i < 64; ++i) {
    threads.emplace_back([&, i] {
      v1::SamplingParams s;
      s.set_max_tokens(4 + i % 9);
      s.set_ignore_eos(true);
      results[i] = Generate(*stub, Prompt(1 + (i * 37) % 300, i), s);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << "request " << i << ": " << results[i].status;
    EXPECT_EQ(results[i].ids.size(), static_cast<size_t>(4 + i % 9));
  }
  EXPECT_TRUE(EverythingFree(*stub));
}

// A client cancel mid-stream frees every block it held.
TEST_P(ClusterTest, ClientCancelFreesEverything) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, GetParam(), 1, 1));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  v1::SamplingParams s;
  s.set_max_tokens(3000);
  s.set_ignore_eos(true);
  Result r =
      Generate(*stub, Prompt(200, 1), s, absl::Seconds(60), [](grpc::ClientContext& ctx, int n) {
        if (n == 5) ctx.TryCancel();
      });
  EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled) << r.status;
  EXPECT_TRUE(EverythingFree(*stub));
}

INSTANTIATE_TEST_SUITE_P(Transports, ClusterTest, ::testing::Values("shm", "tcp"));

// Invariant 1 in every KV dtype: the nodes store, send and attend over bf16, f16, int8 or fp8
// K/V (int8/fp8 with their scales, in the blocks' bytes), and the tokens equal one process's
// with the same KV dtype; nothing is held afterwards. int8 over both transports.
class ClusterKvDtypeTest : public ClusterTest {};

TEST_F(ClusterKvDtypeTest, Bf16OverShmIsTokenExact) {
  ExpectTokenExactAndEverythingFree({}, "shm", "bf16");
}
TEST_F(ClusterKvDtypeTest, F16OverShmIsTokenExact) {
  ExpectTokenExactAndEverythingFree({}, "shm", "f16");
}
TEST_F(ClusterKvDtypeTest, Int8OverShmIsTokenExact) {
  ExpectTokenExactAndEverythingFree({}, "shm", "int8");
}
TEST_F(ClusterKvDtypeTest, Int8OverTcpIsTokenExact) {
  ExpectTokenExactAndEverythingFree({}, "tcp", "int8");
}
TEST_F(ClusterKvDtypeTest, Fp8OverShmIsTokenExact) {
  ExpectTokenExactAndEverythingFree({}, "shm", "fp8");
}

// Gemma 3's block (sliding and global layers with RoPE bases of their own, q/k and sandwich
// norms, GeGLU) through the cluster: greedy tokens equal one process's, past the window too.
TEST(ClusterArchitectureTest, Gemma3IsTokenExactAgainstOneProcess) {
  const std::string dir =
      (fs::temp_directory_path() / absl::StrCat("duet_cluster_gemma_", getpid())).string();
  model::SyntheticOverrides o;
  o.architecture = "Gemma3ForCausalLM";
  o.num_layers = 6;
  o.sliding_window = 16;
  absl::Cleanup remove_dir = [&] { fs::remove_all(dir); };
  ASSERT_TRUE(model::WriteSyntheticModel("tiny", 7, dir, o).ok());
  auto engine = model::LocalEngine::Load(
      dir, {.device = "cpu", .num_threads = 1, .kv_cache_bytes = 64 << 20});
  ASSERT_TRUE(engine.ok()) << engine.status();
  {
    ServeProcess cluster(DUET_BIN, ClusterFlags(dir, "shm", 1, 1));
    ASSERT_TRUE(cluster.ready());
    auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
    for (int len : {1, 15, 40, 300}) {
      std::vector<int32_t> prompt(len);
      for (int i = 0; i < len; ++i) prompt[i] = (i * 29 + len) % 256;
      v1::SamplingParams s;
      s.set_max_tokens(20);
      s.set_ignore_eos(true);
      const Result r = Generate(*stub, prompt, s);
      ASSERT_TRUE(r.status.ok()) << "length " << len << ": " << r.status;
      auto want = (*engine)->Generate(prompt, {.max_tokens = 20, .ignore_eos = true});
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_EQ(r.ids, want->generated_ids) << "length " << len;
    }
    EXPECT_TRUE(EverythingFree(*stub));
  }
}

class ClusterFailureTest : public ClusterTest {};

// Continues a stopped process when it goes out of scope (a stopped child cannot be shut down).
class Stopped {
 public:
  explicit Stopped(pid_t pid) : pid_(pid) { kill(pid_, SIGSTOP); }
  ~Stopped() { Resume(); }
  void Resume() {
    if (pid_ > 0) kill(pid_, SIGCONT);
    pid_ = 0;
  }

 private:
  pid_t pid_;
};

// Kill a decode node mid-stream: its requests continue on the other decode node from the prompt
// and the tokens already streamed, with no error, no repeated and no missing token (greedy and
// seeded equal the single-process run), within the deadline, and nothing leaks on the survivors.
TEST_F(ClusterFailureTest, KilledDecodeNodesRequestsContinueElsewhereTokenExact) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 1, 2));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  std::atomic<int> streaming{0};
  std::vector<std::thread> threads;
  std::vector<Result> results(6);
  auto params = [](int i) {
    // Long enough that every request still runs when the node is killed.
    model::SamplingParams p{.max_tokens = 1500 + 10 * i, .ignore_eos = true};
    if (i % 3 == 0) {
      p.temperature = 0.8f;
      p.seed = 77 + i;
    }
    return p;
  };
  const absl::Time start = absl::Now();
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      const v1::SamplingParams s = rpc::ToProto(params(i));
      results[i] =
          Generate(*stub, Prompt(50, i), s, absl::Seconds(60), [&](grpc::ClientContext&, int n) {
            if (n == 2) streaming++;
          });
    });
  }
  while (streaming.load() < 6 && absl::Now() - start < absl::Seconds(30)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  // Kill the decode node running the most requests (as its heartbeats report them).
  std::string victim;
  for (const absl::Time until = absl::Now() + absl::Seconds(5);
       victim.empty() && absl::Now() < until; absl::SleepFor(absl::Milliseconds(20))) {
    int most = 0;
    const v1::HealthResponse h = Health(*stub);
    for (const v1::NodeStatus& n : h.nodes()) {
      if (n.kind() == v1::NODE_KIND_DECODE && n.load().running_requests() > most) {
        most = n.load().running_requests();
        victim = n.node_id();
      }
    }
  }
  ASSERT_FALSE(victim.empty()) << "no decode node reported a running request";
  ASSERT_GT(cluster.pid_of(victim), 0);
  kill(cluster.pid_of(victim), SIGKILL);
  for (auto& t : threads) t.join();
  int resumed = 0;
  for (int i = 0; i < 6; ++i) {
    const Result& r = results[i];
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status;
    EXPECT_EQ(r.ids, Reference(Prompt(50, i), params(i))) << i;
    resumed += r.timings.resumes();
  }
  EXPECT_GT(resumed, 0) << "no request was on the killed decode node";
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "requests did not end within the deadline";
  EXPECT_TRUE(EverythingFree(*stub));
}

// A decode pool too small for the requests in flight (20 blocks, four requests that grow to 10
// each): the decode node preempts the newest and the coordinator re-prefills it (prompt and
// tokens so far) and continues its stream. Every request finishes with the single-process
// tokens (greedy and seeded, with and without penalties), and nothing is held afterwards.
TEST_F(ClusterFailureTest, FullDecodePoolPreemptsAndResumesTokenExact) {
  ServeProcess cluster(DUET_BIN,
                       ClusterFlags(model_dir_, "shm", 1, 1, {"--kv_cache_bytes=163840"}));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  auto params = [](int i) {
    model::SamplingParams p{.max_tokens = 120, .ignore_eos = true};
    if (i % 2) {
      p.temperature = 0.9f;
      p.seed = 11 + i;
    }
    if (i >= 2) {  // the resumed prefill and decode count the streamed tokens as output
      p.repetition_penalty = 1.2f;
      p.presence_penalty = 0.5f;
      p.frequency_penalty = 0.3f;
      p.min_p = 0.02f;
    }
    return p;
  };
  std::vector<std::thread> threads;
  std::vector<Result> results(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      const v1::SamplingParams s = rpc::ToProto(params(i));
      results[i] = Generate(*stub, Prompt(40, i), s);
    });
  }
  for (auto& t : threads) t.join();
  int resumed = 0;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status;
    EXPECT_EQ(results[i].ids, Reference(Prompt(40, i), params(i))) << i;
    resumed += results[i].timings.resumes();
  }
  EXPECT_GT(resumed, 0) << "the pool was expected to force a preemption";
  EXPECT_TRUE(EverythingFree(*stub));
}

class ClusterSamplingTest : public ClusterTest {};

// min_p, the penalties, logit_bias and min_tokens give the single-process tokens on the cluster
// (the prefill node samples the first token, the decode node the rest, each from the prompt and
// the output so far), greedy and seeded, concurrently, and each changes the tokens.
TEST_F(ClusterSamplingTest, SamplingParametersAreTokenExactAgainstOneProcess) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 1, 1));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  const std::vector<int> lengths = {3, 17, 40, 300};
  auto params = [&](int i) {
    model::SamplingParams p{.max_tokens = 24, .ignore_eos = true};
    if (i % 2) {
      p.temperature = 0.9f;
      p.seed = 500 + i;
    }
    switch (i % 4) {
      case 0:
        p.repetition_penalty = 1.5f;
        break;
      case 1:
        p.presence_penalty = 1.f;
        p.frequency_penalty = 0.7f;
        p.min_p = 0.05f;
        break;
      case 2: {
        // The greedy first token is banned; a stop token boosted to come at once waits for
        // min_tokens.
        const int32_t first = Reference(Prompt(lengths[i / 4 % 4], i), p)[0];
        const int32_t stop = (first + 1) % 256;
        p.logit_bias = {{std::min(first, stop), 0.f}, {std::max(first, stop), 0.f}};
        for (compute::LogitBias& b : p.logit_bias) b.bias = b.id == first ? -100.f : 30.f;
        p.stop_token_ids = {stop};
        p.min_tokens = 5;
        break;
      }
      default:
        p.repetition_penalty = 0.8f;
        p.frequency_penalty = -0.5f;
        p.top_k = 40;
        break;
    }
    return p;
  };
  const int n = static_cast<int>(lengths.size()) * 4;
  std::vector<model::SamplingParams> ps;
  for (int i = 0; i < n; ++i) ps.push_back(params(i));
  std::vector<std::thread> threads;
  std::vector<Result> results(n);
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      results[i] = Generate(*stub, Prompt(lengths[i / 4 % 4], i), rpc::ToProto(ps[i]));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE(i);
    const Result& r = results[i];
    ASSERT_TRUE(r.status.ok()) << r.status;
    const std::vector<int32_t> prompt = Prompt(lengths[i / 4 % 4], i);
    EXPECT_EQ(r.ids, Reference(prompt, ps[i]));
    model::SamplingParams plain = ps[i];
    plain.repetition_penalty = 1.f;
    plain.presence_penalty = plain.frequency_penalty = plain.min_p = 0.f;
    plain.logit_bias.clear();
    plain.min_tokens = 0;
    EXPECT_NE(r.ids, Reference(prompt, plain)) << "the parameters changed nothing";
    if (i % 4 == 2) {  // the stop token came right after min_tokens
      EXPECT_EQ(r.ids.size(), 6u);
      EXPECT_EQ(r.ids.back(), ps[i].stop_token_ids[0]);
    }
  }
  EXPECT_TRUE(EverythingFree(*stub));
}

// The cluster advertises what its pools can hold for one request (20 blocks of 16 = 320
// tokens), and a request longer than that is refused at once, naming the numbers, instead of
// failing mid-stream or being refused as retryable.
TEST_F(ClusterFailureTest, RequestThatCanNeverFitIsRefusedNamingMaxModelLen) {
  ServeProcess cluster(DUET_BIN,
                       ClusterFlags(model_dir_, "shm", 1, 1, {"--kv_cache_bytes=163840"}));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  EXPECT_EQ(Health(*stub).max_model_len(), 320);
  v1::SamplingParams s;
  s.set_max_tokens(100);
  Result r = Generate(*stub, Prompt(250, 1), s);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << r.status;
  EXPECT_NE(r.status.message().find("exceeds max_model_len 320"), std::string::npos) << r.status;
  s.set_max_tokens(70);
  r = Generate(*stub, Prompt(250, 1), s);  // exactly 320
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(EverythingFree(*stub));
}

// Prompts that do not all fit the pools at once (six of 16 blocks, pools of 20) wait for room
// on the coordinator and the prefill node instead of failing, and all finish token-exact.
TEST_F(ClusterFailureTest, PromptsBeyondThePoolsWaitForRoomAndFinish) {
  ServeProcess cluster(DUET_BIN,
                       ClusterFlags(model_dir_, "shm", 1, 1, {"--kv_cache_bytes=163840"}));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  std::vector<std::thread> threads;
  std::vector<Result> results(6);
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      v1::SamplingParams s;
      s.set_max_tokens(4);
      s.set_ignore_eos(true);
      results[i] = Generate(*stub, Prompt(250, 10 + i), s);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status;
    EXPECT_EQ(results[i].ids, Reference(Prompt(250, 10 + i), {.max_tokens = 4, .ignore_eos = true}))
        << i;
  }
  EXPECT_TRUE(EverythingFree(*stub));
}

// A decode node killed just before a burst: Reserves that fail on it are re-routed to the
// healthy one at once (it is suspect from then on), long before its heartbeat deadline.
TEST_F(ClusterFailureTest, ReserveOnADeadDecodeNodeIsReRouted) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 1, 2));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  kill(cluster.pid_of("decode-0"), SIGKILL);
  std::vector<std::thread> threads;
  std::vector<Result> results(16);
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      v1::SamplingParams s;
      s.set_max_tokens(4);
      s.set_ignore_eos(true);
      results[i] = Generate(*stub, Prompt(20, i), s);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status;
    EXPECT_EQ(results[i].ids, Reference(Prompt(20, i), {.max_tokens = 4, .ignore_eos = true}));
  }
  EXPECT_TRUE(EverythingFree(*stub));
}

// A hung prefill node (SIGSTOP): requests routed to it are retried on the other one once it is
// declared dead, and the retry does not wait for the abandoned call (which would end only at
// the 60 s prefill deadline).
TEST_F(ClusterFailureTest, HungPrefillNodeIsRetriedWithoutWaitingForTheAbandonedCall) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 2, 1));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  // First a few requests, so that the decode node is connected to prefill-0 (ties go to it):
  // then a Reserve naming it succeeds, and the Prefill call to it is what hangs.
  for (int i = 0; i < 3; ++i) {
    v1::SamplingParams s;
    s.set_max_tokens(2);
    ASSERT_TRUE(Generate(*stub, Prompt(30, 90 + i), s).status.ok());
  }
  Stopped hung(cluster.pid_of("prefill-0"));
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  std::vector<Result> results(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      v1::SamplingParams s;
      s.set_max_tokens(4);
      s.set_ignore_eos(true);
      results[i] = Generate(*stub, Prompt(30, i), s, absl::Seconds(30));
    });
  }
  for (auto& t : threads) t.join();
  const absl::Duration took = absl::Now() - start;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status;
    EXPECT_EQ(results[i].ids, Reference(Prompt(30, i), {.max_tokens = 4, .ignore_eos = true}));
  }
  EXPECT_LT(took, absl::Seconds(12)) << "the retries waited for the hung node's calls";
  hung.Resume();
}

// A hung decode node (SIGSTOP): a Reserve to it times out (5 s), and the request is re-routed to
// the other decode node: the tracker's deadline outlasts the RPC, so the request is still there.
TEST_F(ClusterFailureTest, ReserveOnAHungDecodeNodeTimesOutAndIsReRouted) {
  ServeProcess cluster(DUET_BIN,
                       ClusterFlags(model_dir_, "shm", 1, 2, {"--heartbeat_timeout_ms=30000"}));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  Stopped hung(cluster.pid_of("decode-0"));
  std::vector<std::thread> threads;
  std::vector<Result> results(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      v1::SamplingParams s;
      s.set_max_tokens(4);
      s.set_ignore_eos(true);
      results[i] = Generate(*stub, Prompt(30, 20 + i), s, absl::Seconds(40));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status;
    EXPECT_EQ(results[i].ids, Reference(Prompt(30, 20 + i), {.max_tokens = 4, .ignore_eos = true}));
  }
  hung.Resume();
}

// A bounded soak at saturation: 2 prefill and 2 decode nodes with 20-block pools, 40 requests
// of mixed lengths from 8 clients (greedy and seeded), one decode node killed and one prefill
// node paused for 3 s (past its heartbeat deadline) mid-run. Every request finishes with the
// single-process tokens, and afterwards no block is held or quarantined on any live node. The
// preemptions and what they cost are printed (docs/benchmarks.md quotes them).
TEST_F(ClusterFailureTest, SoakAtSaturationWithAKilledAndAPausedNodeLosesNothing) {
  ServeProcess cluster(DUET_BIN,
                       ClusterFlags(model_dir_, "shm", 2, 2, {"--kv_cache_bytes=163840"}));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  constexpr int kRequests = 40, kClients = 8;
  auto prompt_len = [](int i) { return 10 + (i * 37) % 80; };
  auto params = [](int i) {
    model::SamplingParams p{.max_tokens = 10 + (i * 53) % 80, .ignore_eos = true};
    if (i % 2) {
      p.temperature = 0.8f;
      p.seed = 500 + i;
    }
    return p;
  };
  std::vector<Result> results(kRequests);
  std::atomic<int> next{0}, done{0};
  std::vector<std::thread> clients;
  const absl::Time start = absl::Now();
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&] {
      for (int i = next++; i < kRequests; i = next++) {
        const v1::SamplingParams s = rpc::ToProto(params(i));
        results[i] = Generate(*stub, Prompt(prompt_len(i), 100 + i), s, absl::Seconds(120));
        done++;
      }
    });
  }
  while (done.load() < kRequests / 4 && absl::Now() - start < absl::Seconds(60)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  kill(cluster.pid_of("decode-1"), SIGKILL);
  {
    Stopped paused(cluster.pid_of("prefill-1"));
    absl::SleepFor(absl::Seconds(3));
  }
  for (auto& t : clients) t.join();
  int resumes = 0, resumed_requests = 0;
  int64_t resume_us = 0;
  std::vector<int64_t> ttft_us;
  for (int i = 0; i < kRequests; ++i) {
    const Result& r = results[i];
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status;
    EXPECT_EQ(r.ids, Reference(Prompt(prompt_len(i), 100 + i), params(i))) << i;
    resumes += r.timings.resumes();
    resumed_requests += r.timings.resumes() > 0;
    resume_us += r.timings.resume_us();
    ttft_us.push_back(r.timings.time_to_first_token_us());
  }
  std::sort(ttft_us.begin(), ttft_us.end());
  std::printf(
      "soak: %d requests in %.1f s, 0 failed; %d resumes over %d requests, %.1f ms each on "
      "average (stream stopped -> next token); TTFT p50 %.1f ms, p90 %.1f ms\n",
      kRequests, absl::ToDoubleSeconds(absl::Now() - start), resumes, resumed_requests,
      resumes ? resume_us / 1e3 / resumes : 0.0, ttft_us[kRequests / 2] / 1e3,
      ttft_us[kRequests * 9 / 10] / 1e3);
  EXPECT_GT(resumes, 0);
  // Blocks the paused prefill node was writing stay quarantined until it answers that it is
  // quiet, or for up to --kv_quarantine_bound (10 s) before it is fenced: a quarantine that began
  // near the end of the run may need all of it, and a loaded machine a few heartbeats more.
  EXPECT_TRUE(EverythingFree(*stub, absl::Seconds(25)));
}

// Kill a prefill node: a request routed to it is retried once on the other and finishes.
TEST_F(ClusterFailureTest, KilledPrefillNodeIsRetriedElsewhere) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 2, 1));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  kill(cluster.pid_of("prefill-0"), SIGKILL);
  v1::SamplingParams s;
  s.set_max_tokens(6);
  s.set_ignore_eos(true);
  for (int i = 0; i < 4; ++i) {
    Result r = Generate(*stub, Prompt(64, i), s);
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.ids, Reference(Prompt(64, i), {.max_tokens = 6, .ignore_eos = true}));
  }
  EXPECT_TRUE(EverythingFree(*stub));
}

// A decode node whose KV layout differs from the cluster's is refused at registration, and the
// message names both layouts.
TEST_F(ClusterFailureTest, MismatchedLayoutIsRefusedAtRegistration) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 1, 1));
  ASSERT_TRUE(cluster.ready());
  ChildProcess decode(
      {DUET_BIN, "decode", "--coordinator=" + cluster.address(), "--model=" + model_dir_,
       "--node_id=decode-odd", "--block_size=32", "--threads=1", "--kv_cache_bytes=8388608"},
      {.merge_stderr = true});
  const std::string out = decode.ReadAll(absl::Now() + absl::Seconds(60));
  EXPECT_GT(decode.Wait(absl::Seconds(10)), 0) << out;
  EXPECT_NE(out.find("block=16"), std::string::npos) << out;
  EXPECT_NE(out.find("block=32"), std::string::npos) << out;
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  EXPECT_EQ(Health(*stub).decode_nodes(), 1);
}

// A decode node whose KV dtype differs from the cluster's is refused at registration, naming
// both dtypes (an int8 block with its scales is not an f32 block).
TEST_F(ClusterFailureTest, MismatchedKvDtypeIsRefusedAtRegistration) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 1, 1));
  ASSERT_TRUE(cluster.ready());
  ChildProcess decode(
      {DUET_BIN, "decode", "--coordinator=" + cluster.address(), "--model=" + model_dir_,
       "--node_id=decode-int8", "--kv_dtype=int8", "--threads=1", "--kv_cache_bytes=8388608"},
      {.merge_stderr = true});
  const std::string out = decode.ReadAll(absl::Now() + absl::Seconds(60));
  EXPECT_GT(decode.Wait(absl::Seconds(10)), 0) << out;
  EXPECT_NE(out.find("dtype=f32"), std::string::npos) << out;
  EXPECT_NE(out.find("dtype=int8 scales=f32/token/head"), std::string::npos) << out;
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  EXPECT_EQ(Health(*stub).decode_nodes(), 1);
}

class ClusterComputeTest : public ClusterTest {};

// Every node of `serve --loopback` gets the launcher's runtime flags: each registers (and the
// coordinator's Health reports) the cpu_gemm, threads and block size given to `serve`.
TEST_F(ClusterComputeTest, SharedFlagsReachEveryNode) {
  ServeProcess cluster(DUET_BIN,
                       ClusterFlags(model_dir_, "shm", 2, 2,
                                    {"--cpu_gemm=openblas", "--threads=2", "--block_size=8"}));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  const v1::HealthResponse h = Health(*stub);
  ASSERT_EQ(h.nodes_size(), 4) << h.DebugString();
  for (const v1::NodeStatus& n : h.nodes()) {
    EXPECT_EQ(n.compute().backend(), "cpu") << n.DebugString();
    EXPECT_EQ(n.compute().cpu_gemm(), "openblas") << n.DebugString();
    EXPECT_EQ(n.compute().threads(), 2) << n.DebugString();
    EXPECT_EQ(n.block_size(), 8) << n.DebugString();
  }
  v1::SamplingParams s;
  s.set_max_tokens(4);
  s.set_ignore_eos(true);
  const Result r = Generate(*stub, Prompt(20, 1), s);
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.ids.size(), 4u);
}

// Token-exactness needs the same GEMM on prefill and decode: a prefill node on another GEMM is
// refused at registration, and the message names both sides.
TEST_F(ClusterComputeTest, MismatchedCpuGemmIsRefusedAtRegistration) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 1, 1));
  ASSERT_TRUE(cluster.ready());
  ChildProcess prefill(
      {DUET_BIN, "prefill", "--coordinator=" + cluster.address(), "--model=" + model_dir_,
       "--node_id=prefill-odd", "--cpu_gemm=openblas", "--threads=1", "--kv_cache_bytes=8388608"},
      {.merge_stderr = true});
  const std::string out = prefill.ReadAll(absl::Now() + absl::Seconds(60));
  EXPECT_GT(prefill.Wait(absl::Seconds(10)), 0) << out;
  EXPECT_NE(out.find("prefill node prefill-odd"), std::string::npos) << out;
  EXPECT_NE(out.find("cpu, gemm openblas"), std::string::npos) << out;
  EXPECT_NE(out.find("cpu, gemm invariant"), std::string::npos) << out;
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  EXPECT_EQ(Health(*stub).prefill_nodes(), 1);
}

}  // namespace
}  // namespace duet
