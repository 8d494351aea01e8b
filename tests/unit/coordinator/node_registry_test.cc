#include "coordinator/node_registry.h"

#include <string>

#include "gtest/gtest.h"

namespace duet::coordinator {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

kv::KvLayout Layout(int head_dim = 16) {
  return kv::KvLayout{.model_id = "tiny",
                      .num_layers = 2,
                      .num_kv_heads = 2,
                      .head_dim = head_dim,
                      .block_size = 16,
                      .dtype = kv::KvDtype::kF32};
}

NodeRegistration Reg(const std::string& id, uint64_t epoch, NodeKind kind = NodeKind::kDecode,
                     kv::KvLayout layout = Layout(), const std::string& cpu_gemm = "invariant") {
  NodeRegistration r;
  r.node = {id, epoch};
  r.kind = kind;
  r.address = "127.0.0.1:" + std::to_string(5000 + epoch);
  r.layout = layout;
  r.compute = {.backend = "cpu", .cpu_gemm = cpu_gemm, .threads = 1};
  r.capacity = {.total_blocks = 100, .max_running_requests = 8};
  r.load = {.free_blocks = 100, .total_blocks = 100};
  return r;
}

bool Contains(absl::string_view haystack, const std::string& needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

TEST(NodeRegistryTest, RegistersAndListsLiveNodesByKindSortedById) {
  NodeRegistry reg({});
  ASSERT_TRUE(reg.Register(Reg("d1", 1), kT0).ok());
  ASSERT_TRUE(reg.Register(Reg("d0", 1), kT0).ok());
  ASSERT_TRUE(reg.Register(Reg("p0", 1, NodeKind::kPrefill), kT0).ok());
  auto decode = reg.LiveNodes(NodeKind::kDecode);
  ASSERT_EQ(decode.size(), 2u);
  EXPECT_EQ(decode[0].node.node_id, "d0");
  EXPECT_EQ(decode[1].node.node_id, "d1");
  auto prefill = reg.LiveNodes(NodeKind::kPrefill);
  ASSERT_EQ(prefill.size(), 1u);
  EXPECT_EQ(prefill[0].node, (NodeIncarnation{"p0", 1}));
  EXPECT_TRUE(reg.IsLive({"d0", 1}));
  EXPECT_FALSE(reg.IsLive({"d0", 2}));
}

TEST(NodeRegistryTest, HigherEpochReplacesTheOldIncarnation) {
  NodeRegistry reg({});
  ASSERT_TRUE(reg.Register(Reg("d0", 1), kT0).ok());
  auto out = reg.Register(Reg("d0", 5), kT0 + absl::Seconds(1));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(out->replaced.has_value());
  EXPECT_EQ(*out->replaced, (NodeIncarnation{"d0", 1}));
  EXPECT_EQ(reg.Find("d0")->node.epoch, 5u);
  EXPECT_EQ(reg.LiveNodes(NodeKind::kDecode).size(), 1u);
  // The old incarnation's heartbeats are refused: it was superseded.
  absl::Status hb = reg.Heartbeat({"d0", 1}, kT0 + absl::Seconds(2));
  EXPECT_EQ(hb.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(hb.message(), "superseded")) << hb;
}

TEST(NodeRegistryTest, StaleOrEqualEpochIsRefusedAndChangesNothing) {
  NodeRegistry reg({});
  ASSERT_TRUE(reg.Register(Reg("d0", 3), kT0).ok());
  for (uint64_t epoch : {3u, 2u}) {
    NodeRegistration r = Reg("d0", epoch);
    r.address = "elsewhere:1";
    auto out = reg.Register(r, kT0 + absl::Seconds(1));
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(out.status().message(), "stale epoch")) << out.status();
    EXPECT_TRUE(Contains(out.status().message(), "epoch 3")) << out.status();
  }
  EXPECT_EQ(reg.Find("d0")->node.epoch, 3u);
  EXPECT_NE(reg.Find("d0")->address, "elsewhere:1");
}

TEST(NodeRegistryTest, RefusesUnsetEpochAndEmptyIdAndInvalidLayout) {
  NodeRegistry reg({});
  EXPECT_EQ(reg.Register(Reg("d0", 0), kT0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.Register(Reg("", 1), kT0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.Register(Reg("d0", 1, NodeKind::kDecode, Layout(0)), kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(reg.Find("d0").has_value());
}

TEST(NodeRegistryTest, LayoutDifferentFromTheClusterIsRefusedNamingBoth) {
  NodeRegistry reg({});
  ASSERT_TRUE(reg.Register(Reg("d0", 1), kT0).ok());
  auto out = reg.Register(Reg("d1", 1, NodeKind::kDecode, Layout(32)), kT0);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  const absl::string_view msg = out.status().message();
  EXPECT_TRUE(Contains(msg, "d0@1")) << msg;  // where the cluster layout came from
  EXPECT_TRUE(Contains(msg, "decode node d1@1")) << msg;
  EXPECT_TRUE(Contains(msg, Layout(16).Describe())) << msg;
  EXPECT_TRUE(Contains(msg, Layout(32).Describe())) << msg;
  EXPECT_FALSE(reg.Find("d1").has_value());
  // Prefill nodes are held to the same layout.
  EXPECT_FALSE(reg.Register(Reg("p0", 1, NodeKind::kPrefill, Layout(32)), kT0).ok());
  EXPECT_TRUE(reg.Register(Reg("p0", 1, NodeKind::kPrefill, Layout(16)), kT0).ok());
}

TEST(NodeRegistryTest, ConfiguredClusterLayoutAppliesToTheFirstNodeToo) {
  NodeRegistry reg({.cluster_layout = Layout(64)});
  auto out = reg.Register(Reg("d0", 1), kT0);
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(Contains(out.status().message(), "configured")) << out.status();
  EXPECT_TRUE(reg.Register(Reg("d0", 1, NodeKind::kDecode, Layout(64)), kT0).ok());
  EXPECT_EQ(reg.cluster_layout()->head_dim, 64);
}

// The coordinator's timer: ExpireDead every `tick` from `from` (exclusive) to `to` (inclusive);
// every node declared dead, with when.
struct Death {
  NodeIncarnation node;
  absl::Time at;
};
std::vector<Death> TickUntil(NodeRegistry& reg, absl::Time from, absl::Time to,
                             absl::Duration tick = absl::Milliseconds(50)) {
  std::vector<Death> dead;
  for (absl::Time t = from + tick; t <= to; t += tick) {
    for (const NodeInfo& d : reg.ExpireDead(t).dead) dead.push_back({d.node, t});
  }
  return dead;
}

TEST(NodeRegistryTest, MissedHeartbeatDeadlineDeclaresDeadOnce) {
  NodeRegistry reg({.heartbeat_timeout = absl::Seconds(3)});
  EXPECT_TRUE(reg.ExpireDead(kT0).dead.empty());  // the timer's first tick
  ASSERT_TRUE(reg.Register(Reg("d0", 1), kT0).ok());
  ASSERT_TRUE(reg.Register(Reg("d1", 1), kT0).ok());
  EXPECT_TRUE(TickUntil(reg, kT0, kT0 + absl::Seconds(2)).empty());
  ASSERT_TRUE(reg.Heartbeat({"d0", 1}, kT0 + absl::Seconds(2)).ok());
  EXPECT_EQ(reg.NextExpiry(), kT0 + absl::Seconds(3));  // d1's
  // Exactly at the timeout nobody is dead yet; on the next tick d1 is (d0 heartbeat at +2).
  EXPECT_TRUE(TickUntil(reg, kT0 + absl::Seconds(2), kT0 + absl::Seconds(3)).empty());
  std::vector<Death> dead =
      TickUntil(reg, kT0 + absl::Seconds(3), kT0 + absl::Seconds(3) + absl::Milliseconds(50));
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].node, (NodeIncarnation{"d1", 1}));
  dead = TickUntil(reg, kT0 + absl::Seconds(3) + absl::Milliseconds(50),
                   kT0 + absl::Seconds(5) + absl::Milliseconds(50));
  ASSERT_EQ(dead.size(), 1u) << "d1 reported twice, or d0 not at all";
  EXPECT_EQ(dead[0].node.node_id, "d0");
  EXPECT_EQ(dead[0].at, kT0 + absl::Seconds(5) + absl::Milliseconds(50));
  EXPECT_TRUE(reg.LiveNodes(NodeKind::kDecode).empty());
  EXPECT_FALSE(reg.NextExpiry().has_value());
  EXPECT_FALSE(reg.IsLive({"d0", 1}));
  EXPECT_EQ(reg.stalled(), absl::ZeroDuration());
}

TEST(NodeRegistryTest, DeadNodeMustReRegisterWithANewerEpoch) {
  NodeRegistry reg({.heartbeat_timeout = absl::Seconds(3)});
  reg.ExpireDead(kT0);
  ASSERT_TRUE(reg.Register(Reg("d0", 1), kT0).ok());
  ASSERT_EQ(TickUntil(reg, kT0, kT0 + absl::Seconds(10)).size(), 1u);
  absl::Status hb = reg.Heartbeat({"d0", 1}, kT0 + absl::Seconds(11));
  EXPECT_EQ(hb.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(hb.message(), "declared dead")) << hb;
  EXPECT_TRUE(Contains(hb.message(), "while the coordinator ran")) << hb;
  EXPECT_FALSE(reg.Register(Reg("d0", 1), kT0 + absl::Seconds(11)).ok());
  auto out = reg.Register(Reg("d0", 2), kT0 + absl::Seconds(12));
  ASSERT_TRUE(out.ok()) << out.status();
  // The dead incarnation was already reported by ExpireDead: not reported again as replaced.
  EXPECT_FALSE(out->replaced.has_value());
  EXPECT_TRUE(reg.Heartbeat({"d0", 2}, kT0 + absl::Seconds(13)).ok());
}

// A coordinator stall (SIGSTOP, a paused VM) longer than the heartbeat timeout is not the nodes'
// silence: when they heartbeat right after it, nobody is declared dead. A node that stays silent
// once the coordinator runs again is still declared dead within its timeout.
TEST(NodeRegistryTest, CoordinatorStallIsNotCountedAsNodeSilence) {
  const absl::Duration kTimeout = absl::Seconds(3);
  const absl::Duration kInterval = absl::Milliseconds(500);
  NodeRegistry reg({.heartbeat_timeout = kTimeout});
  reg.ExpireDead(kT0);
  for (const char* id : {"d0", "d1", "p0"}) ASSERT_TRUE(reg.Register(Reg(id, 1), kT0).ok());
  // Running normally: everyone heartbeats every interval.
  absl::Time t = kT0;
  for (; t < kT0 + absl::Seconds(2); t += kInterval) {
    ASSERT_TRUE(TickUntil(reg, t, t + kInterval).empty());
    for (const char* id : {"d0", "d1", "p0"}) {
      ASSERT_TRUE(reg.Heartbeat({id, 1}, t + kInterval).ok());
    }
  }
  // The coordinator stops for 20 s (nodes heartbeat into the void); its first tick after.
  const absl::Time resumed = t + absl::Seconds(20);
  ExpireOutcome first = reg.ExpireDead(resumed);
  EXPECT_TRUE(first.dead.empty()) << "declared " << first.dead.size() << " dead on resume";
  EXPECT_EQ(first.stall, absl::Seconds(20) - absl::Milliseconds(250));
  EXPECT_EQ(reg.stalled(), first.stall);
  // d0 and p0 heartbeat right after (their queued calls); d1 stays silent.
  ASSERT_TRUE(reg.Heartbeat({"d0", 1}, resumed + absl::Milliseconds(10)).ok());
  ASSERT_TRUE(reg.Heartbeat({"p0", 1}, resumed + absl::Milliseconds(10)).ok());
  std::vector<Death> dead;
  for (absl::Time u = resumed; u < resumed + absl::Seconds(6); u += kInterval) {
    for (const Death& d : TickUntil(reg, u, u + kInterval)) dead.push_back(d);
    ASSERT_TRUE(reg.Heartbeat({"d0", 1}, u + kInterval).ok());
    ASSERT_TRUE(reg.Heartbeat({"p0", 1}, u + kInterval).ok());
  }
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].node, (NodeIncarnation{"d1", 1}));
  // d1 was last heard at t: it had been silent 250 ms of running time when the stall's tick came
  // (the stall's first 250 ms count), so it dies 2.75 s of running after the resume, and in any
  // case within one timeout of it.
  EXPECT_GT(dead[0].at, resumed + kTimeout - absl::Milliseconds(250) - absl::Milliseconds(50));
  EXPECT_LE(dead[0].at, resumed + kTimeout);
  absl::Status hb = reg.Heartbeat({"d1", 1}, resumed + absl::Seconds(7));
  EXPECT_TRUE(Contains(hb.message(), "while the coordinator itself stalled, not counted")) << hb;
}

// A starved coordinator whose timer ticks 400 ms apart counts 250 ms per tick: its nodes' silence
// is what it could have observed, so deaths come later, never early.
TEST(NodeRegistryTest, StarvedTimerCountsAtMostMaxTickGapPerTick) {
  NodeRegistry reg({.heartbeat_timeout = absl::Seconds(3)});
  reg.ExpireDead(kT0);
  ASSERT_TRUE(reg.Register(Reg("d0", 1), kT0).ok());
  // 3 s of running time at 250 ms per 400 ms tick: 12 ticks (4.8 s); dead on the 13th.
  std::vector<Death> dead = TickUntil(reg, kT0, kT0 + absl::Seconds(8), absl::Milliseconds(400));
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].at, kT0 + 13 * absl::Milliseconds(400));
  EXPECT_EQ(reg.stalled(), 20 * absl::Milliseconds(150));  // 20 ticks to 8 s
}

TEST(NodeRegistryTest, ReportedLoadOverwritesAdjustLoad) {
  NodeRegistry reg({});
  ASSERT_TRUE(reg.Register(Reg("d0", 1), kT0).ok());
  NodeLoad load{.free_blocks = 40, .total_blocks = 100, .queued_tokens = 7, .running_requests = 3};
  ASSERT_TRUE(reg.ReportLoad({"d0", 1}, load).ok());
  EXPECT_EQ(reg.Find("d0")->load, load);
  ASSERT_TRUE(reg.AdjustLoad({"d0", 1}, -50, +1, 0).ok());
  EXPECT_EQ(reg.Find("d0")->load.free_blocks, 0);  // clamped at 0
  EXPECT_EQ(reg.Find("d0")->load.running_requests, 4);
  ASSERT_TRUE(reg.AdjustLoad({"d0", 1}, +500, -10, -100).ok());
  EXPECT_EQ(reg.Find("d0")->load.free_blocks, 100);  // clamped at total
  EXPECT_EQ(reg.Find("d0")->load.running_requests, 0);
  EXPECT_EQ(reg.Find("d0")->load.queued_tokens, 0);
  ASSERT_TRUE(reg.ReportLoad({"d0", 1}, load).ok());
  EXPECT_EQ(reg.Find("d0")->load, load);
  EXPECT_EQ(reg.AdjustLoad({"d0", 2}, 1, 0, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reg.ReportLoad({"nope", 1}, load).code(), absl::StatusCode::kNotFound);
}

// Requests that start and end between two load reports leave no trace; once a report came,
// its report stands and an undo changes nothing.
TEST(NodeRegistryTest, UndoLoadTakesBackOnlyWhatNoLoadReportReplaced) {
  NodeRegistry reg({});
  ASSERT_TRUE(reg.Register(Reg("d0", 1), kT0).ok());
  const NodeLoad load{.free_blocks = 100, .total_blocks = 100, .running_requests = 0};
  ASSERT_TRUE(reg.ReportLoad({"d0", 1}, load).ok());
  for (int i = 0; i < 200; ++i) {  // far more than any running limit
    auto adj = reg.AdjustLoad({"d0", 1}, -3, +1, 0);
    ASSERT_TRUE(adj.ok());
    EXPECT_EQ(reg.Find("d0")->load.running_requests, 1);
    reg.UndoLoad(*adj);
  }
  EXPECT_EQ(reg.Find("d0")->load, load);

  auto a = reg.AdjustLoad({"d0", 1}, -3, +1, 0);
  auto b = reg.AdjustLoad({"d0", 1}, -5, +1, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  reg.UndoLoad(*a);
  EXPECT_EQ(reg.Find("d0")->load.running_requests, 1);
  EXPECT_EQ(reg.Find("d0")->load.free_blocks, 95);
  const NodeLoad reported{.free_blocks = 90, .total_blocks = 100, .running_requests = 2};
  ASSERT_TRUE(reg.ReportLoad({"d0", 1}, reported).ok());
  reg.UndoLoad(*b);  // the report already says what D holds
  EXPECT_EQ(reg.Find("d0")->load, reported);

  // An adjustment of a replaced incarnation is ignored.
  auto old = reg.AdjustLoad({"d0", 1}, -1, +1, 0);
  ASSERT_TRUE(old.ok());
  ASSERT_TRUE(reg.Register(Reg("d0", 2), kT0 + absl::Seconds(3)).ok());
  const NodeLoad fresh = reg.Find("d0")->load;
  reg.UndoLoad(*old);
  EXPECT_EQ(reg.Find("d0")->load, fresh);
}

TEST(NodeRegistryTest, DeregisterRemovesOnlyTheCurrentIncarnation) {
  NodeRegistry reg({});
  ASSERT_TRUE(reg.Register(Reg("d0", 2), kT0).ok());
  EXPECT_EQ(reg.Deregister({"d0", 1}).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(reg.Find("d0").has_value());
  EXPECT_TRUE(reg.Deregister({"d0", 2}).ok());
  EXPECT_FALSE(reg.Find("d0").has_value());
  // The cluster layout stays, so a node with another layout is still refused.
  EXPECT_FALSE(reg.Register(Reg("d1", 1, NodeKind::kDecode, Layout(32)), kT0).ok());
}

// Token-exactness needs every node on the same GEMM: a prefill node on openblas is refused by a
// cluster of invariant nodes, naming both sides; threads may differ.
TEST(NodeRegistryTest, ComputeDifferentFromTheClusterIsRefusedNamingBoth) {
  NodeRegistry reg({});
  ASSERT_TRUE(reg.Register(Reg("d0", 1), kT0).ok());
  auto out = reg.Register(Reg("p0", 1, NodeKind::kPrefill, Layout(), "openblas"), kT0);
  ASSERT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
  const std::string msg(out.status().message());
  EXPECT_TRUE(Contains(msg, "prefill node p0@1 computes with cpu, gemm openblas")) << msg;
  EXPECT_TRUE(Contains(msg, "first registered by d0@1")) << msg;
  EXPECT_TRUE(Contains(msg, "cpu, gemm invariant")) << msg;
  EXPECT_FALSE(reg.Find("p0").has_value());
  NodeRegistration other_threads = Reg("p1", 1, NodeKind::kPrefill);
  other_threads.compute.threads = 8;
  auto ok = reg.Register(other_threads, kT0);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->info.compute, other_threads.compute);
  // Weights kept native beside f32 ones are not token-exact either.
  NodeRegistration native = Reg("p2", 1, NodeKind::kPrefill);
  native.compute.weights = "native";
  auto refused = reg.Register(native, kT0);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(Contains(refused.status().message(),
                       "p2@1 computes with cpu, gemm invariant, weights native"))
      << refused.status();
}

NodeRegistration CacheReg(const std::string& id, uint64_t epoch, bool enabled, kv::BlockHash seed,
                          NodeKind kind = NodeKind::kDecode) {
  NodeRegistration r = Reg(id, epoch, kind);
  r.prefix_cache = {.enabled = enabled, .seed = seed};
  return r;
}

TEST(NodeRegistryTest, RefusesANodeWhoseCacheSeedDiffersFromTheCluster) {
  const kv::BlockHash seed{.low = 1, .high = 2}, other{.low = 3, .high = 4};
  NodeRegistry reg({});
  // Caching off: no seed is the cluster's yet, and none is checked.
  ASSERT_TRUE(reg.Register(CacheReg("d9", 1, false, other), kT0).ok());
  EXPECT_FALSE(reg.cluster_cache_seed().has_value());
  ASSERT_TRUE(reg.Register(CacheReg("d0", 1, true, seed), kT0).ok());
  ASSERT_TRUE(reg.Register(CacheReg("p0", 1, true, seed, NodeKind::kPrefill), kT0).ok());
  EXPECT_EQ(reg.cluster_cache_seed(), seed);
  auto refused = reg.Register(CacheReg("p1", 1, true, other, NodeKind::kPrefill), kT0);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  const absl::string_view msg = refused.status().message();
  EXPECT_TRUE(Contains(msg, "prefill node p1@1")) << msg;
  EXPECT_TRUE(Contains(msg, other.ToHex())) << msg;
  EXPECT_TRUE(Contains(msg, seed.ToHex())) << msg;
  EXPECT_TRUE(Contains(msg, "first cache registered by d0@1")) << msg;
  EXPECT_FALSE(reg.Find("p1").has_value());
  // A node with caching off is not checked; the seed stays the cluster's after d0 leaves.
  EXPECT_TRUE(reg.Register(CacheReg("p2", 1, false, other, NodeKind::kPrefill), kT0).ok());
  ASSERT_TRUE(reg.Deregister({"d0", 1}).ok());
  EXPECT_FALSE(reg.Register(CacheReg("d1", 1, true, other), kT0).ok());
  auto kept = reg.Register(CacheReg("d1", 1, true, seed), kT0);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->info.prefix_cache, (cluster::PrefixCacheInfo{.enabled = true, .seed = seed}));
}

TEST(NodeRegistryTest, ReviseFreeBlocksReplacesTheAdjustmentUntilAHeartbeat) {
  NodeRegistry reg({});
  ASSERT_TRUE(reg.Register(Reg("d0", 1), kT0).ok());
  auto adj = reg.AdjustLoad({"d0", 1}, -10, 1, 0);
  ASSERT_TRUE(adj.ok());
  reg.ReviseFreeBlocks(*adj, -4);  // D held 6 of the 10 blocks already
  EXPECT_EQ(reg.Find("d0")->load.free_blocks, 96);
  reg.UndoLoad(*adj);
  EXPECT_EQ(reg.Find("d0")->load.free_blocks, 100);
  auto later = reg.AdjustLoad({"d0", 1}, -10, 1, 0);
  ASSERT_TRUE(later.ok());
  ASSERT_TRUE(reg.ReportLoad({"d0", 1}, {.free_blocks = 80, .total_blocks = 100}).ok());
  reg.ReviseFreeBlocks(*later, -4);  // the load report stands
  EXPECT_EQ(reg.Find("d0")->load.free_blocks, 80);
}

}  // namespace
}  // namespace duet::coordinator
