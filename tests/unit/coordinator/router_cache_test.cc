// The router's modes over prefix caches: cache_aware scores (P, D) pairs by what they hold and
// how loaded they are; load and round_robin ignore the caches; the hard rules hold in all.
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/base/error_reason.h"
#include "coordinator/router.h"
#include "gtest/gtest.h"

namespace duet::coordinator {
namespace {

NodeInfo Node(const std::string& id, NodeKind kind, int64_t free_blocks, int32_t running,
              int64_t queued, int32_t max_running) {
  NodeInfo n;
  n.node = {id, 1};
  n.kind = kind;
  n.capacity = {.total_blocks = 100, .max_running_requests = max_running};
  n.load = {.free_blocks = free_blocks,
            .total_blocks = 100,
            .queued_tokens = queued,
            .running_requests = running};
  return n;
}
NodeInfo D(const std::string& id, int32_t running = 0, int64_t free_blocks = 100) {
  return Node(id, NodeKind::kDecode, free_blocks, running, 0, 64);
}
NodeInfo P(const std::string& id, int64_t queued = 0) {
  return Node(id, NodeKind::kPrefill, 0, 0, queued, 0);
}

// 160 prompt tokens in blocks of 16: 10 blocks, the first 9 cacheable.
RouteRequest Req(std::vector<std::pair<std::string, int64_t>> hits = {}) {
  RouteRequest r{.request_id = "r1",
                 .prompt_tokens = 160,
                 .blocks_needed = 10,
                 .block_size = 16,
                 .cacheable_blocks = 9};
  for (auto& [id, blocks] : hits) r.cached_blocks[NodeIncarnation{id, 1}] = blocks;
  return r;
}

// "p,d reason" or the error.
std::string Pick(Router& router, const std::vector<NodeInfo>& d, const std::vector<NodeInfo>& p,
                 const RouteRequest& req) {
  absl::StatusOr<RoutePick> pick = router.Pick(d, p, req);
  if (!pick.ok()) return std::string(pick.status().message());
  return pick->prefill.node.node_id + "," + pick->decode.node.node_id + " " +
         RouteReasonName(pick->reason);
}

// As Pick, by a new cache_aware router (no earlier picks to break ties of cost).
std::string PickFresh(const std::vector<NodeInfo>& d, const std::vector<NodeInfo>& p,
                      const RouteRequest& req) {
  Router router(RouterMode::kCacheAware);
  return Pick(router, d, p, req);
}

const std::vector<NodeInfo> kTwoD = {D("d0"), D("d1")};
const std::vector<NodeInfo> kTwoP = {P("p0"), P("p1")};

TEST(RouterCacheTest, CacheAwarePicksTheNodesHoldingThePrefix) {
  Router router(RouterMode::kCacheAware);
  EXPECT_EQ(Pick(router, kTwoD, kTwoP, Req()), "p0,d0 load");
  EXPECT_EQ(Pick(router, kTwoD, kTwoP, Req({{"p1", 8}, {"d1", 9}})), "p1,d1 both");
  EXPECT_EQ(Pick(router, kTwoD, kTwoP, Req({{"p1", 4}})), "p1,d0 prefill_hit");
  EXPECT_EQ(Pick(router, kTwoD, kTwoP, Req({{"d1", 2}})), "p0,d1 decode_hit");
  // The longer run wins.
  EXPECT_EQ(Pick(router, kTwoD, kTwoP, Req({{"p0", 3}, {"p1", 5}, {"d0", 6}, {"d1", 1}})),
            "p1,d0 both");
  absl::StatusOr<RoutePick> pick = router.Pick(kTwoD, kTwoP, Req({{"p1", 8}, {"d1", 9}}));
  ASSERT_TRUE(pick.ok());
  EXPECT_EQ(pick->prefill_cached_blocks, 8);
  EXPECT_EQ(pick->decode_cached_blocks, 9);
  EXPECT_EQ(pick->decode_fresh_blocks, 1);
}

TEST(RouterCacheTest, LoadAndRoundRobinIgnoreTheCaches) {
  Router load(RouterMode::kLoad);
  EXPECT_EQ(Pick(load, kTwoD, kTwoP, Req({{"p1", 8}, {"d1", 9}})), "p0,d0 load");
  // Load still decides: the busier nodes lose even when they hold the prompt.
  EXPECT_EQ(
      Pick(load, {D("d0", 3), D("d1", 1)}, {P("p0", 50), P("p1", 10)}, Req({{"p0", 8}, {"d0", 9}})),
      "p1,d1 load");
  // The reason still says what the chosen nodes held.
  EXPECT_EQ(Pick(load, kTwoD, kTwoP, Req({{"p0", 8}})), "p0,d0 prefill_hit");
  Router rr(RouterMode::kRoundRobin);
  const RouteRequest req = Req({{"p0", 8}, {"d0", 9}});
  EXPECT_EQ(Pick(rr, kTwoD, kTwoP, req), "p0,d0 both");
  EXPECT_EQ(Pick(rr, kTwoD, kTwoP, req), "p1,d1 load");
  EXPECT_EQ(Pick(rr, kTwoD, kTwoP, req), "p0,d0 both");
}

TEST(RouterCacheTest, WeightsTradeHitsAgainstLoad) {
  // p1 holds 8 of 10 blocks but has 100 tokens queued: 0.2 + 0.625 against p0's 1.0.
  const std::vector<NodeInfo> p = {P("p0"), P("p1", 100)};
  // d1 holds 9 blocks but runs 16 of 64: 0.25 * 0.1 + 0.5 * 0.25 against d0's 0.25.
  const std::vector<NodeInfo> d = {D("d0"), D("d1", 16)};
  const RouteRequest req = Req({{"p1", 8}, {"d1", 9}});
  Router defaults(RouterMode::kCacheAware);
  EXPECT_EQ(Pick(defaults, d, p, req), "p1,d1 both");
  Router queue_heavy(RouterMode::kCacheAware, {.queue = 2.0});
  EXPECT_EQ(Pick(queue_heavy, d, p, req), "p0,d1 decode_hit");
  Router no_transfer(RouterMode::kCacheAware, {.transfer = 0.0});
  EXPECT_EQ(Pick(no_transfer, d, p, req), "p1,d0 prefill_hit");
  Router decode_heavy(RouterMode::kCacheAware, {.decode = 2.0});
  EXPECT_EQ(Pick(decode_heavy, d, p, req), "p1,d0 prefill_hit");
  EXPECT_DOUBLE_EQ(Router::Cost(p[1], d[1], req, RouterWeights{}), 0.2 + 0.625 + 0.025 + 0.125);
}

TEST(RouterCacheTest, ExcludedDeadAndFullNodesAreNeverPicked) {
  Router router(RouterMode::kCacheAware);
  RouteRequest req = Req({{"p1", 8}, {"d1", 9}});
  req.excluded_prefill = {"p1"};
  req.excluded_decode = {"d1"};
  EXPECT_EQ(Pick(router, kTwoD, kTwoP, req), "p0,d0 load");
  NodeInfo dead_d1 = D("d1"), dead_p1 = P("p1");
  dead_d1.alive = false;
  dead_p1.alive = false;
  EXPECT_EQ(Pick(router, {D("d0"), dead_d1}, {P("p0"), dead_p1}, Req({{"p1", 8}, {"d1", 9}})),
            "p0,d0 load");
  // d1 holds the prefix but has no free batch slot, or too few blocks even for the rest.
  NodeInfo busy = Node("d1", NodeKind::kDecode, 100, 64, 0, 64);
  EXPECT_EQ(PickFresh({D("d0"), busy}, kTwoP, Req({{"d1", 9}})), "p0,d0 load");
  EXPECT_EQ(PickFresh({D("d0"), D("d1", 0, 0)}, kTwoP, Req({{"d1", 9}})), "p0,d0 load");
  // Its cached blocks count: 1 fresh block fits where the whole prompt (10) would not.
  EXPECT_EQ(PickFresh({D("d0", 0, 5), D("d1", 0, 1)}, kTwoP, Req({{"d1", 9}})), "p0,d1 decode_hit");
  absl::StatusOr<RoutePick> none = router.Pick({D("d0", 0, 5), D("d1", 0, 1)}, kTwoP, Req());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(none.status().message().find("d1@1 has 1 free blocks for 10"), absl::string_view::npos)
      << none.status().message();
  req.excluded_prefill = {"p0", "p1"};
  req.excluded_decode = {};
  EXPECT_EQ(router.Pick(kTwoD, kTwoP, req).status().code(), absl::StatusCode::kUnavailable);
}

TEST(RouterCacheTest, HitsAreCappedAtTheCacheableBlocks) {
  RouteRequest req = Req({{"d0", 50}, {"p0", -3}});
  EXPECT_EQ(req.CachedBlocks({"d0", 1}), 9);
  EXPECT_EQ(req.FreshBlocks({"d0", 1}), 1);
  EXPECT_EQ(req.CachedBlocks({"p0", 1}), 0);
  EXPECT_EQ(req.CachedBlocks({"d0", 2}), 0);  // another incarnation holds nothing
  EXPECT_EQ(req.FreshBlocks({"d9", 1}), 10);
}

TEST(RouterCacheTest, ModesAndWeightsByName) {
  EXPECT_EQ(ParseRouterMode("cache_aware").value(), RouterMode::kCacheAware);
  EXPECT_EQ(ParseRouterMode("load").value(), RouterMode::kLoad);
  EXPECT_EQ(ParseRouterMode("round_robin").value(), RouterMode::kRoundRobin);
  for (RouterMode m : {RouterMode::kCacheAware, RouterMode::kLoad, RouterMode::kRoundRobin}) {
    EXPECT_EQ(ParseRouterMode(RouterModeName(m)).value(), m) << RouterModeName(m);
  }
  absl::Status bad = ParseRouterMode("fastest").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(),
            "unknown router 'fastest': valid values are cache_aware, load, round_robin");
  EXPECT_TRUE(ValidateRouterWeights({}).ok());
  absl::Status neg = ValidateRouterWeights({.transfer = -1});
  EXPECT_EQ(neg.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(neg.message().find("transfer"), absl::string_view::npos) << neg.message();
  EXPECT_FALSE(ValidateRouterWeights({.decode = std::numeric_limits<double>::infinity()}).ok());
}

NodeInfo Fencing(NodeInfo d, std::vector<std::string> fenced) {
  d.load.fenced_senders = std::move(fenced);
  return d;
}

// A decode node's fenced prefill nodes are skipped for that decode node only, in every mode; with
// only fenced pairs left the refusal names them and carries kSenderFenced (the coordinator waits).
TEST(RouterCacheTest, FencedPairsAreSkippedAndOnlyThosePairs) {
  const std::vector<NodeInfo> d = {Fencing(D("d0"), {"p0"}), D("d1")};
  for (RouterMode mode : {RouterMode::kCacheAware, RouterMode::kLoad, RouterMode::kRoundRobin}) {
    Router router(mode);
    for (int i = 0; i < 6; ++i) {
      absl::StatusOr<RoutePick> pick = router.Pick(d, kTwoP, Req({{"p0", 9}, {"d0", 9}}));
      ASSERT_TRUE(pick.ok()) << pick.status();
      EXPECT_FALSE(pick->decode.node.node_id == "d0" && pick->prefill.node.node_id == "p0")
          << RouterModeName(mode);
    }
    // p0 is still used, with d1.
    EXPECT_EQ(Pick(router, {d[0], d[1]}, {P("p0")}, Req()).substr(0, 5), "p0,d1")
        << RouterModeName(mode);
    absl::StatusOr<RoutePick> none = router.Pick({d[0]}, {P("p0")}, Req());
    ASSERT_FALSE(none.ok());
    EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(ReasonOf(none.status()), ErrorReason::kSenderFenced);
    EXPECT_NE(none.status().message().find("d0@1 has p0@1 fenced"), std::string::npos)
        << none.status();
  }
}

// At light load (equal costs: nothing cached, nothing queued) cache_aware spreads over every
// node instead of sending everything to the smallest ids; a cached prefix still wins.
TEST(RouterCacheTest, EqualCostsGoToTheLeastRecentlyPickedPair) {
  Router router(RouterMode::kCacheAware);
  std::set<std::string> prefill, decode;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<RoutePick> pick = router.Pick(kTwoD, kTwoP, Req());
    ASSERT_TRUE(pick.ok());
    prefill.insert(pick->prefill.node.node_id);
    decode.insert(pick->decode.node.node_id);
  }
  EXPECT_EQ(prefill.size(), 2u);
  EXPECT_EQ(decode.size(), 2u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(Pick(router, kTwoD, kTwoP, Req({{"p1", 8}, {"d1", 9}})), "p1,d1 both");
  }
}

// With an affinity (the prompt's first block), ties go by rendezvous hashing on it: the same
// first block always gets the same pair, whatever was picked in between (a conversation's turns
// stay where its first turn's KV is, before the prefix index has heard of it), and different
// first blocks spread over every node.
TEST(RouterCacheTest, EqualCostsFollowThePromptsFirstBlock) {
  Router router(RouterMode::kCacheAware);
  std::set<std::string> prefill, decode;
  for (uint64_t k = 1; k <= 32; ++k) {
    RouteRequest req = Req();
    req.affinity = kv::BlockHash{k * 7919, k};
    absl::StatusOr<RoutePick> first = router.Pick(kTwoD, kTwoP, req);
    ASSERT_TRUE(first.ok());
    prefill.insert(first->prefill.node.node_id);
    decode.insert(first->decode.node.node_id);
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j <= i; ++j) {  // 1, 2, then 3 other picks in between
        ASSERT_TRUE(router.Pick(kTwoD, kTwoP, Req()).ok());
      }
      absl::StatusOr<RoutePick> again = router.Pick(kTwoD, kTwoP, req);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(again->prefill.node, first->prefill.node);
      EXPECT_EQ(again->decode.node, first->decode.node);
    }
  }
  EXPECT_EQ(prefill.size(), 2u);
  EXPECT_EQ(decode.size(), 2u);
}

}  // namespace
}  // namespace duet::coordinator
