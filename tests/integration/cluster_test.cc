// Loopback cluster tests: `duet serve --loopback` starts a coordinator, prefill and decode
// nodes as real processes; these tests talk to it over gRPC and check the invariants of
// docs/design.md §5 on the paths that work: token-exact against the in-process engine (1) in
// every KV dtype, with prefix caching and staging, no leaks (3), layouts and compute (6).
// Faults and pressure: cluster_failure_test.cc.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/http_exchange.h"

namespace duet {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture's helpers

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

// The blocks the coordinator's prefix index credits `node` with (its HTTP front's /metrics at
// `http_url`); -1 when the scrape fails or the series is absent.
double IndexBlocks(const std::string& http_url, const std::string& node) {
  int port = 0;
  if (std::sscanf(http_url.c_str(), "http://127.0.0.1:%d", &port) != 1) return -1;
  const testing::Reply r = testing::Exchange(port, "GET", "/metrics", "");
  const std::string series =
      absl::StrCat("duet_coordinator_prefix_index_blocks{node=\"", node, "\"} ");
  const size_t at = r.body.find(series);
  if (r.status != 200 || at == std::string::npos) return -1;
  return std::atof(r.body.c_str() + at + series.size());
}

// The disk tier across the cluster (--kv_disk_path: each node its own file): the prefill nodes
// keep announcing the blocks their pools evicted into their tiers (the coordinator's index
// credits them with more blocks than their pools hold), and a prompt whose blocks every pool
// evicted for others is loaded back: P loads its blocks instead of computing them, D loads its
// own instead of receiving them, and the tokens equal the in-process engine's.
TEST_P(ClusterTest, EvictedPrefixesAreAnnouncedAndLoadedFromTheDiskTiers) {
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("duet_cluster_kv_disk_", getpid());
  fs::remove_all(dir);
  absl::Cleanup remove = [&] { fs::remove_all(dir); };
  ServeProcess cluster(
      DUET_BIN, ClusterFlags(model_dir_, GetParam(), 2, 2,
                             {"--router=cache_aware", "--kv_cache_bytes=1048576",  // 128 blocks
                              "--kv_disk_path=" + dir.string(), "--kv_disk_bytes=33554432",
                              "--http_port=0"}));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  v1::SamplingParams s;
  s.set_max_tokens(4);
  s.set_ignore_eos(true);
  const std::vector<int32_t> a = Prompt(300, 70);  // 18 full blocks may hit
  const Result first = Generate(*stub, a, s);
  ASSERT_TRUE(first.status.ok()) << first.status;
  // 24 other prompts of 19 blocks: about 12 per node, more than a pool's 128 blocks.
  for (int i = 0; i < 24; ++i) {
    const Result other = Generate(*stub, Prompt(300, 100 + i), s);
    ASSERT_TRUE(other.status.ok()) << i << ": " << other.status;
  }
  absl::SleepFor(absl::Milliseconds(300));  // the nodes' cache events reach the coordinator
  // 25 prompts of 18 full blocks went through the two prefill nodes, whose pools hold 128 each.
  const double p0 = IndexBlocks(cluster.http_url(), "prefill-0");
  const double p1 = IndexBlocks(cluster.http_url(), "prefill-1");
  EXPECT_GE(p0 + p1, 25 * 18) << "prefill-0 " << p0 << ", prefill-1 " << p1;
  const Result again = Generate(*stub, a, s);
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_EQ(again.ids, first.ids);
  EXPECT_EQ(again.ids, Reference(a, {.max_tokens = 4, .ignore_eos = true}));
  EXPECT_EQ(again.timings.prefill_cached_tokens(), 288) << again.timings.DebugString();
  EXPECT_EQ(again.timings.decode_cached_tokens(), 288) << again.timings.DebugString();
  EXPECT_TRUE(EverythingFree(*stub));
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
      dir, {.device = compute::Device::kCpu, .num_threads = 1, .kv_cache_bytes = 64 << 20});
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
  EXPECT_EQ(h.discovery(), "registry");  // the nodes registered with the coordinator
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
