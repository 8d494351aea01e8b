// Invariant 3 (docs/design.md §5) for the coordinator's bookkeeping: after any random mix of
// finished, cancelled, timed-out and failed requests, node deaths and restarts, late and stale
// events, the cache directory agrees with what simulated decode nodes hold at every step, and
// once everything has ended every block is free and the directory and tracker are empty.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "coordinator/cache_directory.h"
#include "coordinator/request_tracker.h"
#include "coordinator/router.h"
#include "gtest/gtest.h"

namespace duet::coordinator {
namespace {

constexpr int kBlocksPerNode = 48;

struct SimDecode {
  NodeIncarnation inc;
  std::set<kv::BlockId> free;
  std::map<RequestId, std::vector<kv::BlockId>> held;
};

struct SimPrefill {
  NodeIncarnation inc;
};

// A Reserve that D has executed but whose answer has not reached the coordinator yet.
struct PendingReserve {
  RequestId request;
  NodeIncarnation decode;
  std::vector<kv::BlockId> blocks;
};

class ClusterSim {
 public:
  explicit ClusterSim(uint64_t seed)
      : rng_(seed),
        tracker_(TrackerOptions{.reserve_timeout = absl::Seconds(1),
                                .prefill_timeout = absl::Seconds(4),
                                .transfer_timeout = absl::Seconds(2),
                                .decode_stall_timeout = absl::Seconds(3),
                                .max_prefill_attempts = 2},
                 &dir_),
        router_(std::make_unique<LeastLoadedDecodePolicy>(),
                std::make_unique<LeastQueuedPrefillPolicy>()) {
    for (int i = 0; i < 3; ++i) decodes_.push_back(FreshDecode({absl::StrCat("d", i), 1}));
    for (int i = 0; i < 3; ++i) prefills_.push_back({{absl::StrCat("p", i), 1}});
  }

  void Step() {
    switch (absl::Uniform(rng_, 0, 24)) {
      case 0:
      case 1:
      case 2:
        return StartRequest();
      case 3:
      case 4:
      case 5:
        return DeliverReserve();
      case 6:
      case 7:
        return FirstToken();
      case 8:
      case 9:
        return Admit();
      case 10:
      case 11:
        return Token();
      case 12:
      case 13:
      case 14:
        return Finish();
      case 15:
        return CancelOne();
      case 16:
        return PrefillFails();
      case 17:
        return DecodeFails();
      case 18:
        return absl::Uniform(rng_, 0, 4) == 0 ? KillNode() : AdvanceTime();
      case 19:
      case 20:
        return AdvanceTime();
      default:
        return StaleEvent();
    }
  }

  // Every step: the directory agrees with the nodes and with the tracker.
  void Check() {
    ASSERT_TRUE(dir_.CheckConsistency().ok()) << dir_.CheckConsistency();
    std::set<NodeIncarnation> live_decode;
    for (const SimDecode& d : decodes_) {
      live_decode.insert(d.inc);
      int64_t held_blocks = 0;
      for (const auto& [req, blocks] : d.held) {
        held_blocks += static_cast<int64_t>(blocks.size());
        const bool pending = std::any_of(pending_.begin(), pending_.end(), [&](const auto& p) {
          return p.request == req && p.decode == d.inc;
        });
        if (pending) continue;
        auto entry = dir_.Find(req);
        ASSERT_TRUE(entry.has_value())
            << d.inc.ToString() << " holds " << req << " unknown to the directory";
        EXPECT_EQ(entry->decode, d.inc) << req;
        EXPECT_EQ(entry->block_ids, blocks) << req;
      }
      int64_t pending_blocks = 0;
      for (const auto& p : pending_) {
        if (p.decode == d.inc) pending_blocks += static_cast<int64_t>(p.blocks.size());
      }
      EXPECT_EQ(dir_.Usage(d.inc).total_blocks() + pending_blocks, held_blocks) << d.inc.ToString();
      EXPECT_EQ(static_cast<int64_t>(d.free.size()) + held_blocks, kBlocksPerNode);
    }
    // Nothing in the directory belongs to a dead incarnation.
    for (const auto& [inc, usage] : dir_.AllUsage()) {
      EXPECT_TRUE(live_decode.contains(inc)) << "stale entries of " << inc.ToString();
    }
    size_t reserved = 0;
    for (const RequestId& id : live_) {
      auto r = tracker_.Find(id);
      ASSERT_TRUE(r.has_value()) << id;
      const KvState state = dir_.StateOf(id);
      if (!r->decode) {
        EXPECT_EQ(state, KvState::kAbsent) << id;
        continue;
      }
      ++reserved;
      const KvState want = r->phase == Phase::kReserve  ? KvState::kReserved
                           : r->phase == Phase::kDecode ? KvState::kOwned
                                                        : KvState::kWriting;
      EXPECT_EQ(state, want) << id << " in phase " << PhaseName(r->phase);
    }
    EXPECT_EQ(dir_.size(), reserved);
    EXPECT_EQ(tracker_.size(), live_.size());
  }

  // Ends everything, by cancelling or by letting every deadline pass, then checks nothing leaked.
  void Drain(bool by_cancel) {
    for (int round = 0; round < 20 && (!live_.empty() || !pending_.empty()); ++round) {
      while (!pending_.empty()) DeliverReserveAt(0);
      if (by_cancel) {
        for (const RequestId& id : std::vector<RequestId>(live_.begin(), live_.end())) {
          Apply(tracker_.Cancel(id, now_));
        }
      } else {
        now_ += absl::Seconds(100);
        Apply(tracker_.ExpireDeadlines(now_));
      }
      Check();
    }
    EXPECT_TRUE(live_.empty());
    EXPECT_TRUE(pending_.empty());
    EXPECT_EQ(tracker_.size(), 0u);
    EXPECT_TRUE(dir_.empty());
    EXPECT_TRUE(dir_.AllUsage().empty());
    for (const SimDecode& d : decodes_) {
      EXPECT_TRUE(d.held.empty()) << d.inc.ToString() << " still holds blocks";
      EXPECT_EQ(d.free.size(), static_cast<size_t>(kBlocksPerNode)) << d.inc.ToString();
    }
  }

  const std::map<absl::StatusCode, int>& outcomes() const { return outcomes_; }
  int retries() const { return retries_; }

 private:
  static SimDecode FreshDecode(NodeIncarnation inc) {
    SimDecode d{std::move(inc), {}, {}};
    for (int b = 0; b < kBlocksPerNode; ++b) d.free.insert(b);
    return d;
  }

  void Apply(Effects fx) {
    for (const auto& rel : fx.releases) {
      for (SimDecode& d : decodes_) {
        if (d.inc != rel.decode) continue;  // a dead incarnation: nothing to free
        auto it = d.held.find(rel.request_id);
        // Every Release the tracker asks for targets blocks the live node really holds.
        ASSERT_NE(it, d.held.end()) << "Release of " << rel.request_id << " on " << d.inc.ToString()
                                    << " which does not hold it";
        for (kv::BlockId b : it->second) d.free.insert(b);
        d.held.erase(it);
      }
    }
    for (const auto& c : fx.prefill_cancels) {
      EXPECT_TRUE(std::any_of(prefills_.begin(), prefills_.end(),
                              [&](const SimPrefill& p) { return p.inc == c.prefill; }))
          << "CancelPrefill sent to " << c.prefill.ToString() << ", not a live incarnation";
    }
    for (const auto& f : fx.finished) {
      outcomes_[f.status.code()]++;
      EXPECT_FALSE(tracker_.Find(f.request_id).has_value()) << f.request_id;
      live_.erase(f.request_id);
    }
    for (const RequestId& r : fx.retries) {
      ++retries_;
      Route(r);
    }
  }
  void Apply(absl::StatusOr<Effects> fx) {
    if (fx.ok()) Apply(*std::move(fx));
  }

  template <typename Pred>
  std::optional<TrackedRequest> Pick(Pred pred) {
    std::vector<TrackedRequest> matches;
    for (const RequestId& id : live_) {
      auto r = tracker_.Find(id);
      if (r && pred(*r)) matches.push_back(*r);
    }
    if (matches.empty()) return std::nullopt;
    return matches[absl::Uniform<size_t>(rng_, 0, matches.size())];
  }

  void StartRequest() {
    if (live_.size() >= 24) return;
    const RequestId id = absl::StrCat("r", next_id_++);
    ASSERT_TRUE(tracker_.Start(id, now_).ok());
    live_.insert(id);
    blocks_wanted_[id] = absl::Uniform(rng_, 1, 12);
    Route(id);
  }

  // Pick D and execute its Reserve (the answer is delivered later).
  void Route(const RequestId& id) {
    std::vector<NodeInfo> nodes;
    for (const SimDecode& d : decodes_) {
      NodeInfo n;
      n.node = d.inc;
      n.kind = NodeKind::kDecode;
      n.load = {.free_blocks = static_cast<int64_t>(d.free.size()),
                .total_blocks = kBlocksPerNode,
                .running_requests = static_cast<int32_t>(d.held.size())};
      nodes.push_back(n);
    }
    RouteRequest req{.request_id = id, .blocks_needed = blocks_wanted_[id]};
    auto picked = router_.PickDecode(nodes, req);
    if (!picked.ok()) {
      Apply(tracker_.Fail(id, picked.status(), now_));
      return;
    }
    SimDecode& d = *std::find_if(decodes_.begin(), decodes_.end(),
                                 [&](const SimDecode& x) { return x.inc == picked->node; });
    ASSERT_FALSE(d.held.contains(id)) << d.inc.ToString() << " already holds " << id;
    std::vector<kv::BlockId> blocks;
    for (int i = 0; i < req.blocks_needed; ++i) {
      blocks.push_back(*d.free.begin());
      d.free.erase(d.free.begin());
    }
    d.held[id] = blocks;
    pending_.push_back({id, d.inc, std::move(blocks)});
  }

  void DeliverReserve() {
    if (pending_.empty()) return;
    DeliverReserveAt(absl::Uniform<size_t>(rng_, 0, pending_.size()));
  }

  void DeliverReserveAt(size_t i) {
    PendingReserve p = pending_[i];
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    Apply(tracker_.OnReserved(p.request, p.decode, p.blocks, now_));
    auto r = tracker_.Find(p.request);
    if (!r || r->phase != Phase::kReserve || r->decode != p.decode) return;
    std::vector<NodeInfo> nodes;
    for (const SimPrefill& sp : prefills_) {
      NodeInfo n;
      n.node = sp.inc;
      n.kind = NodeKind::kPrefill;
      n.load.queued_tokens = absl::Uniform(rng_, 0, 3);
      nodes.push_back(n);
    }
    RouteRequest req{.request_id = p.request, .excluded_prefill = r->failed_prefill};
    auto picked = router_.PickPrefill(nodes, req);
    if (!picked.ok()) {
      Apply(tracker_.Fail(p.request, picked.status(), now_));
      return;
    }
    ASSERT_TRUE(tracker_.OnPrefillStarted(p.request, picked->node, now_).ok());
  }

  void FirstToken() {
    auto r = Pick([](const TrackedRequest& t) { return t.phase == Phase::kPrefill; });
    if (r) {
      ASSERT_TRUE(tracker_.OnFirstToken(r->request_id, *r->prefill, now_).ok());
    }
  }

  void Admit() {
    auto r = Pick([](const TrackedRequest& t) {
      return t.phase == Phase::kPrefill || t.phase == Phase::kTransfer;
    });
    if (r) {
      ASSERT_TRUE(tracker_.OnAdmitted(r->request_id, *r->decode, now_).ok());
    }
  }

  void Token() {
    auto r = Pick([](const TrackedRequest& t) { return t.phase == Phase::kDecode; });
    if (r) {
      ASSERT_TRUE(tracker_.OnToken(r->request_id, now_).ok());
    }
  }

  void Finish() {
    auto r = Pick([](const TrackedRequest& t) { return t.phase == Phase::kDecode; });
    if (!r) return;
    SimDecode& d = *std::find_if(decodes_.begin(), decodes_.end(),
                                 [&](const SimDecode& x) { return x.inc == *r->decode; });
    auto it = d.held.find(r->request_id);
    ASSERT_NE(it, d.held.end());
    for (kv::BlockId b : it->second) d.free.insert(b);  // D frees on finish
    d.held.erase(it);
    auto fx = tracker_.OnFinished(r->request_id, now_);
    ASSERT_TRUE(fx.ok()) << fx.status();
    Apply(*std::move(fx));
  }

  void CancelOne() {
    auto r = Pick([](const TrackedRequest&) { return true; });
    if (r) Apply(tracker_.Cancel(r->request_id, now_));
  }

  void PrefillFails() {
    auto r = Pick([](const TrackedRequest& t) {
      return t.phase == Phase::kPrefill || t.phase == Phase::kTransfer;
    });
    if (!r) return;
    auto fx = tracker_.OnPrefillFailed(r->request_id, *r->prefill,
                                       absl::UnavailableError("prefill crashed"), now_);
    ASSERT_TRUE(fx.ok()) << fx.status();
    Apply(*std::move(fx));
  }

  void DecodeFails() {
    auto r = Pick([](const TrackedRequest& t) { return t.decode.has_value(); });
    if (!r) return;
    auto fx = tracker_.OnDecodeFailed(r->request_id, *r->decode,
                                      absl::UnavailableError("stream broke"), now_);
    ASSERT_TRUE(fx.ok()) << fx.status();
    Apply(*std::move(fx));
  }

  // A node dies (its pool with it) and comes back at once as a new incarnation.
  void KillNode() {
    if (absl::Bernoulli(rng_, 0.5)) {
      SimDecode& d = decodes_[absl::Uniform<size_t>(rng_, 0, decodes_.size())];
      const NodeIncarnation dead = d.inc;
      d = FreshDecode({dead.node_id, dead.epoch + 1});
      // Reserve answers from the dead node never arrive: the RPC fails instead.
      std::vector<RequestId> failed;
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->decode == dead) {
          failed.push_back(it->request);
          it = pending_.erase(it);
        } else {
          ++it;
        }
      }
      Apply(tracker_.OnNodeDead(dead, now_));
      for (const RequestId& id : failed) {
        Apply(tracker_.Fail(id, absl::UnavailableError("Reserve: connection refused"), now_));
      }
    } else {
      SimPrefill& p = prefills_[absl::Uniform<size_t>(rng_, 0, prefills_.size())];
      const NodeIncarnation dead = p.inc;
      p.inc = {dead.node_id, dead.epoch + 1};
      Apply(tracker_.OnNodeDead(dead, now_));
    }
  }

  void AdvanceTime() {
    now_ += absl::Milliseconds(absl::Uniform(rng_, 0, 2500));
    Apply(tracker_.ExpireDeadlines(now_));
  }

  // Events from the wrong node, an old incarnation, or for a request that already ended. Any
  // the tracker accepts are legitimate transitions and are applied.
  void StaleEvent() {
    if (next_id_ == 0) return;
    const RequestId id = absl::StrCat("r", absl::Uniform(rng_, 0, next_id_));
    const NodeIncarnation node{
        absl::StrCat(absl::Bernoulli(rng_, 0.5) ? "d" : "p", absl::Uniform(rng_, 0, 3)),
        absl::Uniform<uint64_t>(rng_, 1, 3)};
    switch (absl::Uniform(rng_, 0, 4)) {
      case 0:
        (void)tracker_.OnFirstToken(id, node, now_);
        break;
      case 1:
        (void)tracker_.OnToken(id, now_);
        break;
      case 2:
        Apply(tracker_.OnPrefillFailed(id, node, absl::UnavailableError("late"), now_));
        break;
      default:
        Apply(tracker_.OnDecodeFailed(id, node, absl::UnavailableError("late"), now_));
        break;
    }
  }

  std::mt19937_64 rng_;
  absl::Time now_ = absl::FromUnixSeconds(3'000'000);
  CacheDirectory dir_;
  RequestTracker tracker_;
  Router router_;
  std::vector<SimDecode> decodes_;
  std::vector<SimPrefill> prefills_;
  std::vector<PendingReserve> pending_;
  std::set<RequestId> live_;
  std::map<RequestId, int64_t> blocks_wanted_;
  int next_id_ = 0;
  int retries_ = 0;
  std::map<absl::StatusCode, int> outcomes_;
};

TEST(CoordinatorInvariantTest, DirectoryAgreesWithNodesUnderRandomMixAndDrainsToEmpty) {
  std::map<absl::StatusCode, int> total;
  int retries = 0;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    ClusterSim sim(seed);
    for (int step = 0; step < 1500; ++step) {
      sim.Step();
      sim.Check();
      if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) {
        FAIL() << "invariant broken at step " << step;
      }
    }
    sim.Drain(/*by_cancel=*/seed % 2 == 0);
    for (const auto& [code, n] : sim.outcomes()) total[code] += n;
    retries += sim.retries();
  }
  // The mix really happened: every kind of ending, and prefill retries.
  for (absl::StatusCode code :
       {absl::StatusCode::kOk, absl::StatusCode::kCancelled, absl::StatusCode::kDeadlineExceeded,
        absl::StatusCode::kUnavailable, absl::StatusCode::kResourceExhausted}) {
    EXPECT_GT(total[code], 0) << absl::StatusCodeToString(code);
  }
  EXPECT_GT(retries, 0);
}

}  // namespace
}  // namespace duet::coordinator
