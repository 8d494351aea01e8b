// Several coordinators over one node pool, with membership on etcd (docs/design.md §4.8): a real
// etcd, two `duet coordinator --etcd-endpoints` and two prefill and one decode node announcing
// themselves there (no --coordinator), as real processes on 127.0.0.1. Both coordinators serve
// the same prompt token-exact; the second turn of a chat sent to the other coordinator hits the
// prefix cache the first turn filled; the nodes' status streams keep them alive past the
// heartbeat timeout; a node announced with another compute, KV layout or prefix-cache seed is
// refused by both, naming its value and the cluster's, and listed in their Health (gRPC and GET
// /health) with the reason; a prefill node killed with
// SIGKILL is gone from both within one lease TTL (+1 s) and requests keep succeeding. Skipped only
// when no etcd is installed.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/etcd/etcd_client.h"
#include "cluster/etcd/node_record.h"
#include "common/kv/block_hash.h"
#include "common/kv/kv_layout.h"
#include "common/model/synthetic_model.h"
#include "duet/v1/client.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "proto/channel.h"
#include "proto/kv_layout_convert.h"
#include "proto/status_util.h"
#include "tests/integration/child_process.h"
#include "tests/integration/etcd_fixture.h"
#include "tests/integration/http_exchange.h"

#ifndef DUET_BIN
#error "DUET_BIN must point at the duet binary"
#endif

namespace duet {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;
using testing::EtcdFixture;

constexpr char kPrefix[] = "/duet-test";
constexpr int kLeaseTtlSeconds = 2;
// Above the lease TTL + 1 s: a killed node must go by its lease, not by its silence.
constexpr int kHeartbeatTimeoutMs = 4000;

v1::HealthResponse Health(v1::Generation::Stub& stub) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, absl::Seconds(2));
  v1::HealthResponse h;
  (void)stub.Health(&ctx, v1::HealthRequest(), &h);
  return h;
}

bool Lists(const v1::HealthResponse& h, const std::string& node_id) {
  for (const v1::NodeStatus& n : h.nodes()) {
    if (n.node_id() == node_id) return true;
  }
  return false;
}

const v1::RefusedNode* RefusedIn(const v1::HealthResponse& h, const std::string& node_id) {
  for (const v1::RefusedNode& r : h.refused_nodes()) {
    if (r.node_id() == node_id) return &r;
  }
  return nullptr;
}

struct Result {
  absl::Status status;
  std::vector<int32_t> ids;
  v1::RequestTimings timings;
};

// Greedy, `max_tokens` tokens whatever the model says.
Result Generate(v1::Generation::Stub& stub, const std::vector<int32_t>& prompt, int max_tokens) {
  v1::GenerateRequest req;
  req.mutable_token_ids()->mutable_ids()->Assign(prompt.begin(), prompt.end());
  req.mutable_sampling()->set_max_tokens(max_tokens);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, absl::Seconds(30));
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse r;
  Result out;
  while (reader->Read(&r)) {
    if (r.has_token()) out.ids.push_back(r.token_id());
    if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) out.timings = r.timings();
  }
  out.status = rpc::FromGrpcStatus(reader->Finish());
  if (out.status.ok() && static_cast<int>(out.ids.size()) != max_tokens) {
    out.status = absl::InternalError(absl::StrCat(out.ids.size(), " tokens, not ", max_tokens));
  }
  return out;
}

std::vector<int32_t> Prompt(int n, int seed) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 31 + seed * 17 + 7) % 256);
  return p;
}

// Polls `pred` on each coordinator's Health until it holds for all or `timeout` passed.
template <typename Pred>
bool WaitAll(const std::vector<v1::Generation::Stub*>& stubs, absl::Duration timeout, Pred pred) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    bool all = true;
    for (v1::Generation::Stub* s : stubs) all = all && pred(Health(*s));
    if (all) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

class EtcdClusterTest : public EtcdFixture {
 protected:
  static void SetUpTestSuite() {
    model_dir_ =
        (fs::temp_directory_path() / absl::StrCat("duet_etcd_cluster_test_", getpid())).string();
    ASSERT_TRUE(model::WriteSyntheticModel("tiny", 3, model_dir_).ok());
  }
  static void TearDownTestSuite() { fs::remove_all(model_dir_); }

  // `duet coordinator` watching etcd, with the HTTP API: its client address once it printed
  // "serving on" and its HTTP port, or "".
  static std::string StartCoordinator(std::unique_ptr<ChildProcess>& process,
                                      const std::string& etcd_url, int& http_port) {
    process = std::make_unique<ChildProcess>(std::vector<std::string>{
        DUET_BIN, "coordinator", "--model=" + model_dir_, "--listen=127.0.0.1:0",
        "--etcd_endpoints=" + etcd_url, absl::StrCat("--etcd_prefix=", kPrefix),
        absl::StrCat("--heartbeat_timeout_ms=", kHeartbeatTimeoutMs), "--http_port=0"});
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    std::string address;
    while (std::optional<std::string> line = process->ReadLine(deadline)) {
      constexpr absl::string_view kServing = "coordinator serving on ";
      constexpr absl::string_view kHttp = "coordinator HTTP API on http://";
      if (absl::StartsWith(*line, kServing)) address = line->substr(kServing.size());
      if (absl::StartsWith(*line, kHttp) &&
          absl::SimpleAtoi(line->substr(line->rfind(':') + 1), &http_port)) {
        return address;
      }
    }
    return "";
  }

  static std::unique_ptr<ChildProcess> StartNode(const std::string& kind, const std::string& id,
                                                 const std::string& etcd_url) {
    return std::make_unique<ChildProcess>(std::vector<std::string>{
        DUET_BIN, kind, "--model=" + model_dir_, "--node_id=" + id, "--etcd_endpoints=" + etcd_url,
        absl::StrCat("--etcd_prefix=", kPrefix),
        absl::StrCat("--etcd_lease_ttl_s=", kLeaseTtlSeconds), "--threads=1",
        "--kv_cache_bytes=16777216", "--transport=shm"});
  }

  static std::string model_dir_;
};
std::string EtcdClusterTest::model_dir_;

TEST_F(EtcdClusterTest, TwoCoordinatorsServeOneNodePool) {
  const std::string url = etcd_->client_url();

  // Declared before the nodes: destroyed (stopped) after them, whatever fails.
  std::unique_ptr<ChildProcess> coordinator_a, coordinator_b;
  int http_a = 0, http_b = 0;
  const std::string address_a = StartCoordinator(coordinator_a, url, http_a);
  const std::string address_b = StartCoordinator(coordinator_b, url, http_b);
  ASSERT_FALSE(address_a.empty());
  ASSERT_FALSE(address_b.empty());
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  nodes.push_back(StartNode("prefill", "prefill-0", url));
  nodes.push_back(StartNode("prefill", "prefill-1", url));
  nodes.push_back(StartNode("decode", "decode-0", url));
  auto a = v1::Generation::NewStub(rpc::MakeChannel(address_a));
  auto b = v1::Generation::NewStub(rpc::MakeChannel(address_b));
  const std::vector<v1::Generation::Stub*> both = {a.get(), b.get()};

  ASSERT_TRUE(WaitAll(both, absl::Seconds(90),
                      [](const v1::HealthResponse& h) {
                        return h.ready() && h.prefill_nodes() == 2 && h.decode_nodes() == 1;
                      }))
      << "coordinator a: " << Health(*a).ShortDebugString()
      << "\ncoordinator b: " << Health(*b).ShortDebugString();
  const std::string discovery = absl::StrCat("etcd ", url, " ", kPrefix);
  EXPECT_EQ(Health(*a).discovery(), discovery);
  EXPECT_EQ(Health(*b).discovery(), discovery);

  // The same prompt, greedy, through each coordinator: the same tokens.
  {
    const Result via_a = Generate(*a, Prompt(40, 1), 8);
    const Result via_b = Generate(*b, Prompt(40, 1), 8);
    ASSERT_TRUE(via_a.status.ok()) << via_a.status;
    ASSERT_TRUE(via_b.status.ok()) << via_b.status;
    EXPECT_EQ(via_a.ids, via_b.ids);
  }

  // A two-turn chat: the first turn through a, the second (the first's prompt and answer, then
  // more) through b, which knows from the nodes' status streams where the first turn's prompt
  // is cached.
  {
    const std::vector<int32_t> turn1 = Prompt(64, 2);
    const Result first = Generate(*a, turn1, 6);
    ASSERT_TRUE(first.status.ok()) << first.status;
    absl::SleepFor(absl::Seconds(1));  // the cache events reach b (every 100 ms)
    std::vector<int32_t> turn2 = turn1;
    turn2.insert(turn2.end(), first.ids.begin(), first.ids.end());
    const std::vector<int32_t> more = Prompt(12, 3);
    turn2.insert(turn2.end(), more.begin(), more.end());
    const Result second = Generate(*b, turn2, 6);
    ASSERT_TRUE(second.status.ok()) << second.status;
    // At least the first turn's full blocks (16 tokens each) but its last.
    EXPECT_GE(second.timings.prefill_cached_tokens(), 48) << second.timings.ShortDebugString();
    std::printf("second turn through the other coordinator: %d of %zu prompt tokens cached\n",
                second.timings.prefill_cached_tokens(), turn2.size());
  }

  // Nodes on etcd send no heartbeats: their status streams keep them alive past the heartbeat
  // timeout (the same incarnations, none declared dead).
  {
    absl::SleepFor(absl::Milliseconds(kHeartbeatTimeoutMs) + absl::Seconds(1));
    for (v1::Generation::Stub* s : both) {
      const v1::HealthResponse h = Health(*s);
      EXPECT_EQ(h.prefill_nodes(), 2) << h.ShortDebugString();
      EXPECT_EQ(h.decode_nodes(), 1) << h.ShortDebugString();
    }
  }

  // A node announced with another compute, KV layout or prefix-cache seed than the cluster's:
  // refused by both, each naming the node's value and the cluster's, listed in their Health
  // with the reason, not routed to; listed no more once its announcement goes.
  {
    const std::string decode_key = absl::StrCat(kPrefix, "/nodes/decode-0");
    absl::StatusOr<etcd::RangeResult> got = client().Get(decode_key);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->kvs.size(), 1u);
    absl::StatusOr<v1::RegisterRequest> cluster_reg = etcd::DecodeNodeRecord(kPrefix, got->kvs[0]);
    ASSERT_TRUE(cluster_reg.ok()) << cluster_reg.status();
    absl::StatusOr<kv::KvLayout> cluster_layout = rpc::FromProto(cluster_reg->layout());
    ASSERT_TRUE(cluster_layout.ok()) << cluster_layout.status();
    const kv::BlockHash cluster_seed{.low = cluster_reg->prefix_cache().seed_low(),
                                     .high = cluster_reg->prefix_cache().seed_high()};
    ASSERT_TRUE(cluster_reg->prefix_cache().enabled());
    struct Odd {
      const char* what;
      std::function<void(v1::RegisterRequest&)> change;
      std::vector<std::string> named;  // in the reason: the node's value and the cluster's
    };
    kv::KvLayout odd_layout = *cluster_layout;
    odd_layout.block_size = cluster_layout->block_size * 2;
    const kv::BlockHash odd_seed{.low = cluster_seed.low ^ 1, .high = cluster_seed.high};
    const std::vector<Odd> odds = {
        {"compute",
         [](v1::RegisterRequest& r) { r.mutable_compute()->set_cpu_gemm("openblas"); },
         {"openblas", "invariant"}},
        {"KV layout",
         [&](v1::RegisterRequest& r) { *r.mutable_layout() = rpc::ToProto(odd_layout); },
         {odd_layout.Describe(), cluster_layout->Describe()}},
        {"prefix-cache seed",
         [&](v1::RegisterRequest& r) {
           r.mutable_prefix_cache()->set_seed_low(odd_seed.low);
           r.mutable_prefix_cache()->set_seed_high(odd_seed.high);
         },
         {odd_seed.ToHex(), cluster_seed.ToHex()}}};
    for (const Odd& odd : odds) {
      SCOPED_TRACE(odd.what);
      v1::RegisterRequest reg = *cluster_reg;
      reg.mutable_node()->set_node_id("decode-odd");
      reg.mutable_node()->set_epoch(etcd::NextNodeEpoch(0));
      odd.change(reg);
      absl::StatusOr<std::string> value = etcd::EncodeNodeValue(reg);
      ASSERT_TRUE(value.ok()) << value.status();
      absl::StatusOr<etcd::Lease> lease = client().GrantLease(absl::Seconds(30));
      ASSERT_TRUE(lease.ok()) << lease.status();
      ASSERT_TRUE(client().Put(absl::StrCat(kPrefix, "/nodes/decode-odd"), *value, lease->id).ok());
      ASSERT_TRUE(WaitAll(both, absl::Seconds(5), [&](const v1::HealthResponse& h) {
        const v1::RefusedNode* r = RefusedIn(h, "decode-odd");
        return r != nullptr && r->epoch() == reg.node().epoch();
      })) << Health(*a).ShortDebugString();
      for (int port : {http_a, http_b}) {  // GET /health says the same
        const testing::Reply reply = testing::Exchange(port, "GET", "/health", "");
        ASSERT_EQ(reply.status, 200) << reply.head << reply.body;
        const nlohmann::json j = nlohmann::json::parse(reply.body, nullptr, false);
        ASSERT_TRUE(j.is_object()) << reply.body;
        EXPECT_EQ(j.value("discovery", ""), discovery) << reply.body;
        ASSERT_TRUE(j["refused_nodes"].is_array() && j["refused_nodes"].size() == 1) << reply.body;
        EXPECT_EQ(j["refused_nodes"][0].value("node_id", ""), "decode-odd") << reply.body;
        for (const std::string& named : odd.named) {
          EXPECT_TRUE(absl::StrContains(j["refused_nodes"][0].value("reason", ""), named))
              << named << " not in " << reply.body;
        }
      }
      for (v1::Generation::Stub* s : both) {
        const v1::HealthResponse h = Health(*s);
        const v1::RefusedNode* r = RefusedIn(h, "decode-odd");
        ASSERT_NE(r, nullptr);
        for (const std::string& named : odd.named) {
          EXPECT_TRUE(absl::StrContains(r->reason(), named)) << named << " not in " << r->reason();
        }
        EXPECT_FALSE(Lists(h, "decode-odd"));
        EXPECT_EQ(h.decode_nodes(), 1);
      }
      ASSERT_TRUE(client().RevokeLease(lease->id).ok());
      EXPECT_TRUE(WaitAll(both, absl::Seconds(5), [](const v1::HealthResponse& h) {
        return h.refused_nodes_size() == 0;
      })) << Health(*a).ShortDebugString();
    }
  }

  // prefill-1 crashes: within one lease TTL (+1 s) neither coordinator lists it (so neither
  // routes to it), and requests through both keep succeeding.
  {
    ASSERT_EQ(kill(nodes[1]->pid(), SIGKILL), 0);
    const absl::Time killed = absl::Now();
    for (int i = 0; i < 4; ++i) {
      const Result r = Generate(i % 2 == 0 ? *a : *b, Prompt(24, 10 + i), 4);
      EXPECT_TRUE(r.status.ok()) << "request " << i << " after the kill: " << r.status;
    }
    ASSERT_TRUE(WaitAll(both, absl::Seconds(kLeaseTtlSeconds + 1) - (absl::Now() - killed),
                        [](const v1::HealthResponse& h) { return !Lists(h, "prefill-1"); }))
        << "prefill-1 still listed " << absl::FormatDuration(absl::Now() - killed)
        << " after its kill: a: " << Health(*a).ShortDebugString()
        << "\nb: " << Health(*b).ShortDebugString();
    std::printf("prefill-1 gone from both coordinators %s after its kill\n",
                absl::FormatDuration(absl::Now() - killed).c_str());
    for (int i = 0; i < 4; ++i) {
      const Result r = Generate(i % 2 == 0 ? *a : *b, Prompt(24, 20 + i), 4);
      EXPECT_TRUE(r.status.ok()) << "request " << i << " after prefill-1 went: " << r.status;
    }
    EXPECT_EQ(Health(*a).prefill_nodes(), 1);
    EXPECT_EQ(Health(*b).prefill_nodes(), 1);
  }
}

}  // namespace
}  // namespace duet
