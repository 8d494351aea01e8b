#include "coordinator/router.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace duet::coordinator {
namespace {

NodeInfo Node(const std::string& id, NodeKind kind, int64_t free_blocks, int32_t running,
              int64_t queued = 0, int32_t max_running = 0) {
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
NodeInfo D(const std::string& id, int64_t free_blocks, int32_t running, int32_t max_running = 0) {
  return Node(id, NodeKind::kDecode, free_blocks, running, 0, max_running);
}
NodeInfo P(const std::string& id, int64_t queued, int32_t running = 0) {
  return Node(id, NodeKind::kPrefill, 0, running, queued);
}

Router DefaultRouter() {
  return Router(std::make_unique<LeastLoadedDecodePolicy>(),
                std::make_unique<LeastQueuedPrefillPolicy>());
}

RouteRequest Req(int64_t blocks) {
  return RouteRequest{.request_id = "r1", .prompt_tokens = blocks * 16, .blocks_needed = blocks};
}

std::string PickD(Router& router, const std::vector<NodeInfo>& nodes, int64_t blocks) {
  auto picked = router.PickDecode(nodes, Req(blocks));
  return picked.ok() ? picked->node.node_id : std::string(picked.status().message());
}

TEST(RouterTest, DecodePrefersSmallestBatchThenMostFreeBlocks) {
  Router router = DefaultRouter();
  EXPECT_EQ(PickD(router, {D("d0", 90, 3), D("d1", 10, 1), D("d2", 50, 2)}, 4), "d1");
  EXPECT_EQ(PickD(router, {D("d0", 30, 2), D("d1", 80, 2), D("d2", 50, 2)}, 4), "d1");
}

TEST(RouterTest, DecodeTiesBreakOnNodeIdWhateverTheInputOrder) {
  Router router = DefaultRouter();
  std::vector<NodeInfo> nodes = {D("d2", 50, 1), D("d0", 50, 1), D("d1", 50, 1), D("d3", 49, 1)};
  std::mt19937 rng(7);
  for (int i = 0; i < 20; ++i) {
    std::shuffle(nodes.begin(), nodes.end(), rng);
    EXPECT_EQ(PickD(router, nodes, 4), "d0");
  }
}

TEST(RouterTest, DecodeSkipsNodesThatCannotFitAndRefusesWhenNoneCan) {
  Router router = DefaultRouter();
  // d0 is idle but too full; d1 fits exactly.
  EXPECT_EQ(PickD(router, {D("d0", 3, 0), D("d1", 4, 5)}, 4), "d1");
  // d0 has blocks but no free batch slot.
  EXPECT_EQ(PickD(router, {D("d0", 90, 8, 8), D("d1", 5, 7, 8)}, 4), "d1");
  auto refused = router.PickDecode({D("d0", 3, 0), D("d1", 50, 8, 8)}, Req(4));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  const absl::string_view msg = refused.status().message();
  EXPECT_NE(msg.find("r1"), absl::string_view::npos) << msg;
  EXPECT_NE(msg.find("d0@1 has 3 free blocks"), absl::string_view::npos) << msg;
  EXPECT_NE(msg.find("8/8 running"), absl::string_view::npos) << msg;
}

TEST(RouterTest, PreferredSiblingNodesWinInEveryModeWhenTheyPassTheHardRules) {
  const std::vector<NodeInfo> decodes = {D("d0", 90, 0), D("d1", 50, 3, 8), D("d2", 2, 0)};
  const std::vector<NodeInfo> prefills = {P("p0", 0), P("p1", 5000)};
  for (RouterMode mode : {RouterMode::kCacheAware, RouterMode::kLoad, RouterMode::kRoundRobin}) {
    Router router(mode);
    RouteRequest req = Req(4);
    req.preferred_decode = NodeIncarnation{"d1", 1};
    req.preferred_prefill = NodeIncarnation{"p1", 1};
    absl::StatusOr<RoutePick> pick = router.Pick(decodes, prefills, req);
    ASSERT_TRUE(pick.ok()) << pick.status();
    EXPECT_EQ(pick->decode.node.node_id, "d1") << RouterModeName(mode);
    EXPECT_EQ(pick->prefill.node.node_id, "p1") << RouterModeName(mode);
    EXPECT_EQ(pick->reason, RouteReason::kSibling);
    // A preferred decode node without room (d2: 2 free blocks for 4) is passed over; the other
    // kind's preference still holds.
    req.preferred_decode = NodeIncarnation{"d2", 1};
    pick = router.Pick(decodes, prefills, req);
    ASSERT_TRUE(pick.ok()) << pick.status();
    EXPECT_NE(pick->decode.node.node_id, "d2") << RouterModeName(mode);
    EXPECT_EQ(pick->prefill.node.node_id, "p1") << RouterModeName(mode);
    // An older incarnation of a node is not that node.
    req.preferred_decode = NodeIncarnation{"d1", 0};
    req.preferred_prefill = NodeIncarnation{"p1", 0};
    pick = router.Pick(decodes, prefills, req);
    ASSERT_TRUE(pick.ok()) << pick.status();
    EXPECT_NE(pick->reason, RouteReason::kSibling) << RouterModeName(mode);
    EXPECT_EQ(pick->prefill.node.node_id, "p0") << RouterModeName(mode);
  }
}

TEST(RouterTest, NoLiveDecodeNodeIsUnavailable) {
  Router router = DefaultRouter();
  NodeInfo dead = D("d0", 90, 0);
  dead.alive = false;
  auto picked = router.PickDecode({dead, P("p0", 0)}, Req(1));
  ASSERT_FALSE(picked.ok());
  EXPECT_EQ(picked.status().code(), absl::StatusCode::kUnavailable);
  RouteRequest excluded = Req(1);
  excluded.excluded_decode = {"d0"};
  EXPECT_EQ(router.PickDecode({D("d0", 90, 0)}, excluded).status().code(),
            absl::StatusCode::kUnavailable);
}

// A refusal keeps the causes of earlier attempts: "no prefill node available (1 live,
// excluded: p0)" says why p0 is excluded (its transfer timed out).
TEST(RouterTest, RefusalNamesWhyTheExcludedNodesFailedBefore) {
  Router router = DefaultRouter();
  RouteRequest req = Req(1);
  req.excluded_prefill = {"p0"};
  req.earlier_failures = {"p0@1: request r1: transfer phase exceeded its 10s deadline"};
  auto picked = router.Pick({D("d0", 90, 0)}, {P("p0", 0)}, req);
  ASSERT_FALSE(picked.ok());
  EXPECT_EQ(picked.status().code(), absl::StatusCode::kUnavailable);
  const absl::string_view msg = picked.status().message();
  EXPECT_NE(msg.find("no prefill node available (1 live, excluded: p0)"), absl::string_view::npos)
      << msg;
  EXPECT_NE(msg.find("earlier: p0@1: request r1: transfer phase exceeded its 10s deadline"),
            absl::string_view::npos)
      << msg;
}

// A refusal says why each excluded node is excluded where the caller knows it (D refused it as
// fenced or unreachable; a suspect decode node), and carries the reason when it is why every
// live node of that kind is excluded: a request whose only prefill node its decode node fenced
// is refused UNAVAILABLE with kSenderFenced (HTTP 503 "sender_fenced"), never without a cause.
TEST(RouterTest, RefusalNamesWhyEachNodeIsExcludedAndCarriesTheSharedReason) {
  for (RouterMode mode : {RouterMode::kCacheAware, RouterMode::kLoad}) {
    Router router(mode);
    RouteRequest req = Req(1);
    req.excluded_prefill = {"p0", "p0"};  // listed once
    req.exclusions["p0"] = {.why = "fenced by d0@1", .reason = ErrorReason::kSenderFenced};
    auto fenced = router.Pick({D("d0", 90, 0)}, {P("p0", 0)}, req);
    ASSERT_FALSE(fenced.ok());
    EXPECT_EQ(fenced.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(ReasonOf(fenced.status()), ErrorReason::kSenderFenced) << fenced.status();
    EXPECT_NE(fenced.status().message().find(
                  "no prefill node available (1 live, excluded: p0 (fenced by d0@1))"),
              absl::string_view::npos)
        << fenced.status();

    // Two live prefill nodes, excluded for different causes: each named, no shared reason.
    req.excluded_prefill = {"p0", "p1"};
    req.exclusions["p1"] = {.why = "unreachable from d0@1",
                            .reason = ErrorReason::kSenderUnreachable};
    auto mixed = router.Pick({D("d0", 90, 0)}, {P("p0", 0), P("p1", 0)}, req);
    ASSERT_FALSE(mixed.ok());
    EXPECT_EQ(ReasonOf(mixed.status()), ErrorReason::kNone) << mixed.status();
    EXPECT_NE(
        mixed.status().message().find("excluded: p0 (fenced by d0@1),p1 (unreachable from d0@1))"),
        absl::string_view::npos)
        << mixed.status();
    // One excluded for a cause the earlier failures give (no exclusion): no shared reason.
    req.exclusions.erase("p1");
    auto failed = router.Pick({D("d0", 90, 0)}, {P("p0", 0), P("p1", 0)}, req);
    ASSERT_FALSE(failed.ok());
    EXPECT_EQ(ReasonOf(failed.status()), ErrorReason::kNone) << failed.status();
    EXPECT_NE(failed.status().message().find("excluded: p0 (fenced by d0@1),p1)"),
              absl::string_view::npos)
        << failed.status();
    // A dead prefill node does not count: the live one's reason is the refusal's.
    NodeInfo dead = P("p1", 0);
    dead.alive = false;
    auto with_dead = router.Pick({D("d0", 90, 0)}, {P("p0", 0), dead}, req);
    ASSERT_FALSE(with_dead.ok());
    EXPECT_EQ(ReasonOf(with_dead.status()), ErrorReason::kSenderFenced) << with_dead.status();

    // A suspect decode node is named as such.
    RouteRequest suspect = Req(1);
    suspect.excluded_decode = {"d0"};
    suspect.exclusions["d0"] = {.why = "suspect until its next heartbeat"};
    auto no_d = router.Pick({D("d0", 90, 0)}, {P("p0", 0)}, suspect);
    ASSERT_FALSE(no_d.ok());
    EXPECT_EQ(ReasonOf(no_d.status()), ErrorReason::kNone);
    EXPECT_NE(no_d.status().message().find("excluded: d0 (suspect until its next heartbeat))"),
              absl::string_view::npos)
        << no_d.status();
  }
}

// Nodes whose whole pool is smaller than the request can grow to (decode) or than its prompt
// (prefill) are never picked, and the refusal says so.
TEST(RouterTest, NodesWhosePoolCanNeverHoldTheRequestAreSkipped) {
  Router router = DefaultRouter();
  NodeInfo small = D("d0", 50, 0), big = D("d1", 10, 3);
  small.load.total_blocks = 50;
  big.load.total_blocks = 200;
  RouteRequest req = Req(4);
  req.total_blocks_needed = 120;
  auto picked = router.Pick({small, big}, {P("p0", 0)}, req);
  ASSERT_TRUE(picked.ok()) << picked.status();
  EXPECT_EQ(picked->decode.node.node_id, "d1");
  auto refused = router.PickDecode({small}, req);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("d0@1 holds 50 blocks in all"), absl::string_view::npos)
      << refused.status();
  NodeInfo tiny_p = P("p0", 0);
  tiny_p.load.total_blocks = 3;
  auto no_p = router.Pick({big}, {tiny_p}, req);
  ASSERT_FALSE(no_p.ok());
  EXPECT_NE(no_p.status().message().find("no prefill node can hold"), absl::string_view::npos)
      << no_p.status();
}

TEST(RouterTest, PrefillPrefersFewestQueuedTokensThenRunningThenId) {
  Router router = DefaultRouter();
  auto pick = [&](const std::vector<NodeInfo>& nodes, RouteRequest req) {
    auto p = router.PickPrefill(nodes, req);
    return p.ok() ? p->node.node_id : std::string(p.status().message());
  };
  EXPECT_EQ(pick({P("p0", 900), P("p1", 100), P("p2", 500)}, Req(1)), "p1");
  EXPECT_EQ(pick({P("p0", 100, 3), P("p1", 100, 1), P("p2", 100, 2)}, Req(1)), "p1");
  EXPECT_EQ(pick({P("p2", 100, 1), P("p1", 100, 1)}, Req(1)), "p1");
  // Decode nodes are never prefill candidates; excluded nodes are skipped.
  EXPECT_EQ(pick({D("d0", 90, 0), P("p1", 500)}, Req(1)), "p1");
  RouteRequest retry = Req(1);
  retry.excluded_prefill = {"p1"};
  EXPECT_EQ(pick({P("p0", 900), P("p1", 100)}, retry), "p0");
  retry.excluded_prefill = {"p0", "p1"};
  auto none = router.PickPrefill({P("p0", 900), P("p1", 100)}, retry);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("excluded: p0,p1"), absl::string_view::npos)
      << none.status();
}

TEST(RouterTest, RoundRobinCyclesInIdOrderAndSurvivesMembershipChanges) {
  Router router(std::make_unique<RoundRobinPolicy>(), std::make_unique<RoundRobinPolicy>());
  std::vector<NodeInfo> nodes = {P("p2", 0), P("p0", 999), P("p1", 5)};
  std::vector<std::string> picks;
  for (int i = 0; i < 4; ++i) picks.push_back(router.PickPrefill(nodes, Req(1))->node.node_id);
  EXPECT_EQ(picks, (std::vector<std::string>{"p0", "p1", "p2", "p0"}));
  // p1 leaves: after p0 comes p2; then wrap to p0.
  std::vector<NodeInfo> fewer = {P("p0", 0), P("p2", 0)};
  EXPECT_EQ(router.PickPrefill(fewer, Req(1))->node.node_id, "p2");
  EXPECT_EQ(router.PickPrefill(fewer, Req(1))->node.node_id, "p0");
  // Round robin for decode still only picks nodes that fit.
  std::vector<NodeInfo> decode = {D("d0", 50, 0), D("d1", 2, 0), D("d2", 50, 0)};
  EXPECT_EQ(PickD(router, decode, 4), "d0");
  EXPECT_EQ(PickD(router, decode, 4), "d2");
  EXPECT_EQ(PickD(router, decode, 4), "d0");
}

class BadPolicy : public NodePolicy {
 public:
  std::string_view name() const override { return "bad"; }
  size_t Pick(const std::vector<NodeInfo>& candidates, const RouteRequest&) override {
    return candidates.size();
  }
};

TEST(RouterTest, PolicyIndexOutOfRangeIsAnInternalError) {
  Router router(std::make_unique<BadPolicy>(), std::make_unique<BadPolicy>());
  EXPECT_EQ(router.PickDecode({D("d0", 50, 0)}, Req(1)).status().code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(router.PickPrefill({P("p0", 0)}, Req(1)).status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace duet::coordinator
