// Membership on etcd (EtcdNodeAnnouncer, EtcdNodeWatcher) against the real etcd (Debian's
// 3.4 binary), started per test on 127.0.0.1 (tests/integration/etcd_process.h). Crashed nodes
// are etcd_announce_peer processes killed with SIGKILL. Skipped only when no etcd is installed.

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cluster/etcd/etcd_client.h"
#include "cluster/etcd/node_announcer.h"
#include "cluster/etcd/node_record.h"
#include "cluster/etcd/node_watcher.h"
#include "tests/integration/child_process.h"
#include "tests/integration/etcd_fixture.h"
#include "tests/integration/etcd_process.h"

namespace duet::etcd {
namespace {

using duet::testing::ChildProcess;
using duet::testing::EtcdProcess;
using Changes = std::vector<std::string>;

constexpr char kPrefix[] = "/duet";

std::string Up(const std::string& id, uint64_t epoch) {
  return absl::StrCat("up ", id, "@", epoch);
}
std::string Down(const std::string& id, uint64_t epoch) {
  return absl::StrCat("down ", id, "@", epoch);
}

duet::v1::RegisterRequest Registration(const std::string& id, uint64_t epoch = 0) {
  duet::v1::RegisterRequest r;
  r.mutable_node()->set_node_id(id);
  r.mutable_node()->set_epoch(epoch);
  r.set_kind(duet::v1::NODE_KIND_PREFILL);
  r.set_address("127.0.0.1:7001");
  r.set_transfer_address("ucx-address-bytes");
  r.mutable_layout()->set_model_id("smollm2-135m");
  r.mutable_layout()->set_num_layers(30);
  r.mutable_layout()->set_fingerprint(0xfeedULL);
  r.mutable_capacity()->set_max_batch_tokens(8192);
  r.mutable_compute()->set_backend("cpu");
  r.mutable_compute()->set_cpu_gemm("invariant");
  r.mutable_prefix_cache()->set_enabled(true);
  r.mutable_prefix_cache()->set_seed_high(99);
  return r;
}

// What one watcher reported, in order, and the registrations it reported up.
class Recorder {
 public:
  EtcdNodeWatcherOptions Options(RetryBackoffOptions retry = {.initial = absl::Milliseconds(50),
                                                              .max = absl::Milliseconds(500)}) {
    return {
        .prefix = kPrefix,
        .on_node_up =
            [this](const duet::v1::RegisterRequest& r) {
              absl::MutexLock lock(&mu_);
              changes_.push_back(Up(r.node().node_id(), r.node().epoch()));
              ups_[changes_.back()] = r;
            },
        .on_node_down =
            [this](const std::string& id, uint64_t epoch) {
              absl::MutexLock lock(&mu_);
              changes_.push_back(Down(id, epoch));
            },
        .start_timeout = absl::Seconds(10),
        .retry = retry,
        .watch = {.probe_interval = absl::Milliseconds(200), .probe_timeout = absl::Seconds(1)}};
  }
  // True once `n` changes were reported within `timeout`.
  bool AwaitCount(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return changes_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }
  Changes changes() {
    absl::MutexLock lock(&mu_);
    return changes_;
  }
  std::optional<duet::v1::RegisterRequest> registration(const std::string& up) {
    absl::MutexLock lock(&mu_);
    auto it = ups_.find(up);
    if (it == ups_.end()) return std::nullopt;
    return it->second;
  }

 private:
  absl::Mutex mu_;
  Changes changes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, duet::v1::RegisterRequest> ups_ ABSL_GUARDED_BY(mu_);
};

// A node in a process of its own (etcd_announce_peer), to be killed with SIGKILL.
class PeerNode {
 public:
  PeerNode(const std::string& url, const std::string& id, int ttl_s)
      : child_({DUET_ETCD_PEER_BIN, url, kPrefix, id, absl::StrCat(ttl_s)}) {
    std::optional<std::string> line = child_.ReadLine(absl::Now() + absl::Seconds(20));
    if (line.has_value() && absl::StartsWith(*line, "announced ")) {
      (void)absl::SimpleAtoi(line->substr(10), &epoch_);
    }
  }
  uint64_t epoch() const { return epoch_; }  // 0: it did not announce
  void Kill() {
    kill(child_.pid(), SIGKILL);
    child_.Wait(absl::Seconds(10));
  }

 private:
  ChildProcess child_;
  uint64_t epoch_ = 0;
};

class EtcdMembershipTest : public duet::testing::EtcdFixture {
 protected:
  std::unique_ptr<EtcdNodeWatcher> StartWatcher(Recorder& recorder,
                                                RetryBackoffOptions retry = {
                                                    .initial = absl::Milliseconds(50),
                                                    .max = absl::Milliseconds(500)}) {
    absl::StatusOr<std::unique_ptr<EtcdNodeWatcher>> w =
        EtcdNodeWatcher::Start(client(), recorder.Options(retry));
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? *std::move(w) : nullptr;
  }
  std::unique_ptr<EtcdNodeAnnouncer> StartAnnouncer(
      const std::string& id, absl::Duration ttl,
      std::function<void(uint64_t)> on_new_epoch = nullptr) {
    absl::StatusOr<std::unique_ptr<EtcdNodeAnnouncer>> a = EtcdNodeAnnouncer::Start(
        client(), {.prefix = kPrefix,
                   .registration = Registration(id),
                   .lease_ttl = ttl,
                   .start_timeout = absl::Seconds(20),
                   .retry = {.initial = absl::Milliseconds(50), .max = absl::Milliseconds(500)},
                   .on_new_epoch = std::move(on_new_epoch)});
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? *std::move(a) : nullptr;
  }
  std::unique_ptr<PeerNode> StartPeer(const std::string& id, int ttl_s) {
    auto peer = std::make_unique<PeerNode>(etcd_->client_url(), id, ttl_s);
    EXPECT_NE(peer->epoch(), 0u) << "etcd_announce_peer " << id << " did not announce";
    return peer;
  }

};

TEST_F(EtcdMembershipTest, AnnounceIsDiscoveredAndShutdownRemovesTheKeyAtOnce) {
  Recorder early;
  auto w1 = StartWatcher(early);
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(early.changes(), Changes({}));
  std::unique_ptr<EtcdNodeAnnouncer> node = StartAnnouncer("prefill-0", absl::Seconds(5));
  ASSERT_NE(node, nullptr);
  const uint64_t epoch = node->epoch();
  EXPECT_EQ(node->key(), "/duet/nodes/prefill-0");
  EXPECT_TRUE(node->announced());
  ASSERT_TRUE(early.AwaitCount(1, absl::Seconds(5))) << "no up";
  // The watcher reports the whole registration, every field as announced.
  duet::v1::RegisterRequest expected = Registration("prefill-0", epoch);
  std::optional<duet::v1::RegisterRequest> seen = early.registration(Up("prefill-0", epoch));
  ASSERT_TRUE(seen.has_value()) << ::testing::PrintToString(early.changes());
  EXPECT_EQ(seen->SerializeAsString(), expected.SerializeAsString());

  // A watcher started later finds the node in its listing, before Start returns.
  Recorder late;
  auto w2 = StartWatcher(late);
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(late.changes(), Changes({Up("prefill-0", epoch)}));
  EXPECT_EQ(w2->listings(), 1);

  // Shutdown revokes the lease: the key goes now, not a TTL later.
  const absl::Time stopped = absl::Now();
  node.reset();
  ASSERT_TRUE(early.AwaitCount(2, absl::Seconds(2))) << "no down within 2 s (TTL 5 s)";
  ASSERT_TRUE(late.AwaitCount(2, absl::Seconds(2)));
  std::cerr << "down reported " << absl::FormatDuration(absl::Now() - stopped)
            << " after the announcer's destruction\n";
  const Changes want = {Up("prefill-0", epoch), Down("prefill-0", epoch)};
  EXPECT_EQ(early.changes(), want);
  EXPECT_EQ(late.changes(), want);
  absl::StatusOr<RangeResult> left = client().Get("/duet/nodes/prefill-0");
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_TRUE(left->kvs.empty());
  EXPECT_TRUE(w1->Nodes().empty());
}

TEST_F(EtcdMembershipTest, KilledNodeGoesDownWithinOneTtl) {
  Recorder recorder;
  auto watcher = StartWatcher(recorder);
  ASSERT_NE(watcher, nullptr);
  constexpr int kTtlS = 3;
  std::unique_ptr<PeerNode> peer = StartPeer("decode-0", kTtlS);
  ASSERT_TRUE(recorder.AwaitCount(1, absl::Seconds(5)));
  const absl::Time killed = absl::Now();
  peer->Kill();
  // The last keepalive went out at most TTL/3 before the kill; etcd checks expiries every
  // 500 ms. Allow the TTL plus 1 s.
  ASSERT_TRUE(recorder.AwaitCount(2, absl::Seconds(kTtlS + 1)))
      << "no down within " << kTtlS + 1 << " s of SIGKILL";
  std::cerr << "down reported " << absl::FormatDuration(absl::Now() - killed)
            << " after SIGKILL (lease TTL " << kTtlS << " s)\n";
  EXPECT_EQ(recorder.changes(),
            Changes({Up("decode-0", peer->epoch()), Down("decode-0", peer->epoch())}));
  EXPECT_TRUE(watcher->Nodes().empty());
}

// A node restarted before its old lease lapsed overwrites its key with a larger epoch; the old
// lease lapsing later removes nothing. Two watchers report the same sequence.
TEST_F(EtcdMembershipTest, RestartIsANewEpochAndWatchersAgree) {
  Recorder first;
  Recorder second;
  auto w1 = StartWatcher(first);
  auto w2 = StartWatcher(second);
  ASSERT_NE(w1, nullptr);
  ASSERT_NE(w2, nullptr);
  constexpr int kTtlS = 3;
  std::unique_ptr<PeerNode> old_peer = StartPeer("decode-0", kTtlS);
  ASSERT_TRUE(first.AwaitCount(1, absl::Seconds(5)));
  old_peer->Kill();
  std::unique_ptr<PeerNode> new_peer = StartPeer("decode-0", kTtlS);
  ASSERT_GT(new_peer->epoch(), old_peer->epoch());
  ASSERT_TRUE(first.AwaitCount(3, absl::Seconds(5)));
  // The old lease lapses within its TTL: nothing may change.
  absl::SleepFor(absl::Seconds(kTtlS + 1));
  const Changes restarted = {Up("decode-0", old_peer->epoch()), Down("decode-0", old_peer->epoch()),
                             Up("decode-0", new_peer->epoch())};
  EXPECT_EQ(first.changes(), restarted);
  ASSERT_EQ(w1->Nodes().size(), 1u);
  EXPECT_EQ(w1->Nodes()[0].node().epoch(), new_peer->epoch());
  new_peer->Kill();
  ASSERT_TRUE(first.AwaitCount(4, absl::Seconds(kTtlS + 1)));
  ASSERT_TRUE(second.AwaitCount(4, absl::Seconds(1)));
  Changes all = restarted;
  all.push_back(Down("decode-0", new_peer->epoch()));
  EXPECT_EQ(first.changes(), all);
  EXPECT_EQ(second.changes(), all);
}

// etcd killed (SIGKILL) for a few seconds and restarted on its data: the watchers keep every
// node known meanwhile and resume from their revision (no listing); the announcers keep their
// leases; a node killed while etcd was down goes down once its lease lapses, a node started
// after goes up, each reported once by both watchers.
TEST_F(EtcdMembershipTest, EtcdKilledAndRestartedLosesAndDuplicatesNothing) {
  Recorder fast;
  Recorder slow;
  auto w_fast = StartWatcher(fast);
  // Tries again 3 s after each failure: it is away while changes are made after the restart.
  auto w_slow = StartWatcher(slow, {.initial = absl::Seconds(3), .max = absl::Seconds(3)});
  ASSERT_NE(w_fast, nullptr);
  ASSERT_NE(w_slow, nullptr);
  std::unique_ptr<EtcdNodeAnnouncer> a = StartAnnouncer("a", absl::Seconds(10));
  std::unique_ptr<EtcdNodeAnnouncer> b = StartAnnouncer("b", absl::Seconds(10));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  constexpr int kTtlS = 3;
  std::unique_ptr<PeerNode> d = StartPeer("d", kTtlS);
  ASSERT_TRUE(fast.AwaitCount(3, absl::Seconds(5)));
  ASSERT_TRUE(slow.AwaitCount(3, absl::Seconds(5)));
  const Changes before = fast.changes();

  etcd_->Kill();
  d->Kill();
  absl::SleepFor(absl::Seconds(3));
  EXPECT_FALSE(w_fast->watching());
  EXPECT_EQ(w_fast->Nodes().size(), 3u) << "known nodes must stay known while etcd is down";
  EXPECT_EQ(fast.changes(), before);
  EXPECT_EQ(slow.changes(), before);
  ASSERT_TRUE(etcd_->Restart().ok());

  std::unique_ptr<EtcdNodeAnnouncer> c = StartAnnouncer("c", absl::Seconds(10));
  ASSERT_NE(c, nullptr);
  // d's lease lapses a TTL after etcd's return (etcd restarts every lease's TTL on recovery).
  ASSERT_TRUE(fast.AwaitCount(5, absl::Seconds(kTtlS + 5)))
      << ::testing::PrintToString(fast.changes());
  ASSERT_TRUE(slow.AwaitCount(5, absl::Seconds(kTtlS + 5)))
      << ::testing::PrintToString(slow.changes());
  absl::SleepFor(absl::Seconds(1));  // anything extra would show now
  Changes after = before;
  after.push_back(Up("c", c->epoch()));
  after.push_back(Down("d", d->epoch()));
  EXPECT_EQ(fast.changes(), after);
  EXPECT_EQ(slow.changes(), after);
  for (EtcdNodeWatcher* w : {w_fast.get(), w_slow.get()}) {
    EXPECT_TRUE(w->watching());
    EXPECT_EQ(w->listings(), 1) << "resumed from its revision, not by listing again";
    EXPECT_EQ(w->Nodes().size(), 3u);
  }
  // a and b kept their leases (10 s TTL, etcd away for about 4 s): still the same incarnation.
  EXPECT_TRUE(a->announced());
  EXPECT_TRUE(b->announced());
}

// etcd away for longer than a node's lease TTL: nobody saw the lease expire, so the announcer
// keeps it (its keeper retries past the TTL) and, once etcd is back (it extends every lease on
// recovery), the node is the same incarnation under the same lease: the watcher reports nothing.
TEST_F(EtcdMembershipTest, EtcdAwayPastTheLeaseTtlKeepsTheIncarnation) {
  Recorder recorder;
  auto watcher = StartWatcher(recorder);
  ASSERT_NE(watcher, nullptr);
  absl::Mutex mu;
  std::vector<uint64_t> new_epochs;
  constexpr absl::Duration kTtl = absl::Seconds(2);
  std::unique_ptr<EtcdNodeAnnouncer> node = StartAnnouncer("n", kTtl, [&](uint64_t epoch) {
    absl::MutexLock lock(&mu);
    new_epochs.push_back(epoch);
  });
  ASSERT_NE(node, nullptr);
  const uint64_t first = node->epoch();
  const int64_t first_lease = node->lease_id();
  ASSERT_TRUE(recorder.AwaitCount(1, absl::Seconds(5)));

  etcd_->Kill();
  absl::SleepFor(kTtl * 2);
  EXPECT_TRUE(node->announced());
  ASSERT_TRUE(etcd_->Restart().ok());
  absl::SleepFor(kTtl * 3);  // a lease given up would have lapsed by now
  EXPECT_EQ(node->epoch(), first);
  EXPECT_EQ(node->lease_id(), first_lease);
  EXPECT_TRUE(node->announced());
  EXPECT_EQ(recorder.changes(), Changes({Up("n", first)}));
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(new_epochs.empty());
  }
  absl::StatusOr<RangeResult> key = client().Get(node->key());
  ASSERT_TRUE(key.ok()) << key.status();
  ASSERT_EQ(key->kvs.size(), 1u);
  EXPECT_EQ(key->kvs[0].lease, first_lease);
}

// A lease etcd says is gone (here revoked; as when it expired while the node could not reach
// etcd): coordinators saw the key go, so the announcer announces a new incarnation under a new
// lease; the watcher reports the old one down and the new one up, once each, and the new lease
// is kept alive.
TEST_F(EtcdMembershipTest, LostLeaseIsAnnouncedAgainAsANewEpoch) {
  Recorder recorder;
  auto watcher = StartWatcher(recorder);
  ASSERT_NE(watcher, nullptr);
  absl::Mutex mu;
  std::vector<uint64_t> new_epochs;
  constexpr absl::Duration kTtl = absl::Seconds(2);
  std::unique_ptr<EtcdNodeAnnouncer> node = StartAnnouncer("n", kTtl, [&](uint64_t epoch) {
    absl::MutexLock lock(&mu);
    new_epochs.push_back(epoch);
  });
  ASSERT_NE(node, nullptr);
  const uint64_t first = node->epoch();
  const int64_t first_lease = node->lease_id();
  ASSERT_TRUE(recorder.AwaitCount(1, absl::Seconds(5)));

  ASSERT_TRUE(client().RevokeLease(first_lease).ok());
  ASSERT_TRUE(recorder.AwaitCount(3, absl::Seconds(10)))
      << ::testing::PrintToString(recorder.changes());
  absl::SleepFor(kTtl * 2);  // the new lease outlives its TTL
  const uint64_t second = node->epoch();
  EXPECT_GT(second, first);
  EXPECT_TRUE(node->announced());
  EXPECT_NE(node->lease_id(), first_lease);
  EXPECT_EQ(recorder.changes(), Changes({Up("n", first), Down("n", first), Up("n", second)}));
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(new_epochs, std::vector<uint64_t>({second}));
  }
  absl::StatusOr<RangeResult> key = client().Get(node->key());
  ASSERT_TRUE(key.ok()) << key.status();
  ASSERT_EQ(key->kvs.size(), 1u);
  EXPECT_EQ(key->kvs[0].lease, node->lease_id());
  absl::StatusOr<duet::v1::RegisterRequest> stored = DecodeNodeRecord(kPrefix, key->kvs[0]);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->node().epoch(), second);
}

// A watcher away while its next revision is compacted lists again and reports only the
// difference; a refused value there is counted and holds no node.
TEST_F(EtcdMembershipTest, CompactedRevisionRelistsAndReportsTheDifference) {
  Recorder recorder;
  // Tries again 10 s after a failure: etcd is back and compacted by then.
  auto watcher = StartWatcher(recorder, {.initial = absl::Seconds(10), .max = absl::Seconds(10)});
  ASSERT_NE(watcher, nullptr);
  std::unique_ptr<EtcdNodeAnnouncer> a = StartAnnouncer("a", absl::Seconds(10));
  std::unique_ptr<EtcdNodeAnnouncer> b = StartAnnouncer("b", absl::Seconds(10));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(recorder.AwaitCount(2, absl::Seconds(5)));
  const int64_t away_from = watcher->revision();
  const uint64_t b_epoch = b->epoch();

  ASSERT_TRUE(etcd_->Restart().ok());  // SIGKILL, then the same data: the watch broke
  b.reset();                           // revoked: b's key is deleted
  std::unique_ptr<EtcdNodeAnnouncer> c = StartAnnouncer("c", absl::Seconds(10));
  ASSERT_NE(c, nullptr);
  absl::StatusOr<Lease> lease = client().GrantLease(absl::Seconds(30));
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::StatusOr<int64_t> last = client().Put("/duet/nodes/x", "not a registration", lease->id);
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_TRUE(client().Compact(*last).ok());
  ASSERT_EQ(watcher->revision(), away_from) << "the watcher came back before the compaction";

  ASSERT_TRUE(recorder.AwaitCount(4, absl::Seconds(15)));
  absl::SleepFor(absl::Milliseconds(500));  // anything extra would show now
  EXPECT_EQ(recorder.changes(), Changes({Up("a", a->epoch()), Up("b", b_epoch), Down("b", b_epoch),
                                         Up("c", c->epoch())}));
  EXPECT_EQ(watcher->listings(), 2);
  EXPECT_EQ(watcher->refused_values(), 1);
  EXPECT_GE(watcher->revision(), *last);
  EXPECT_TRUE(watcher->watching());
}

// Records written by hand follow the same rules: an older epoch never replaces a newer one, a
// bad value (unparsable, unleased, misplaced) is refused and counted, and takes down the node
// known at its key; a delete removes the incarnation known there.
TEST_F(EtcdMembershipTest, RawRecordsFollowTheEpochRuleAndBadValuesAreRefused) {
  Recorder recorder;
  auto watcher = StartWatcher(recorder);
  ASSERT_NE(watcher, nullptr);
  absl::StatusOr<Lease> lease = client().GrantLease(absl::Seconds(30));
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto put = [&](const std::string& key, const std::string& value, int64_t lease_id) {
    absl::StatusOr<int64_t> r = client().Put(key, value, lease_id);
    ASSERT_TRUE(r.ok()) << r.status();
  };
  auto record = [](const std::string& id, uint64_t epoch) {
    return *EncodeNodeValue(Registration(id, epoch));
  };
  const std::string n = "/duet/nodes/n";
  put(n, record("n", 5), lease->id);
  put(n, record("n", 3), lease->id);      // older: ignored
  put(n, "\xff\xff garbage", lease->id);  // refused: n@5 is gone
  ASSERT_TRUE(recorder.AwaitCount(2, absl::Seconds(5)));
  EXPECT_TRUE(watcher->Nodes().empty());
  put(n, record("n", 7), lease->id);
  put(n, record("n", 8), 0);  // refused (no lease): n@7 is gone
  ASSERT_TRUE(recorder.AwaitCount(4, absl::Seconds(5)));
  EXPECT_TRUE(watcher->Nodes().empty());
  put("/duet/nodes/m", record("n", 9), lease->id);    // refused: the value names another node
  put("/duet/nodes/a/b", record("b", 1), lease->id);  // refused: not a node key
  put(n, record("n", 9), lease->id);
  ASSERT_TRUE(client().Delete(n).ok());
  put("/duet/nodes/done", record("done", 1), lease->id);  // the last change
  ASSERT_TRUE(recorder.AwaitCount(7, absl::Seconds(5)))
      << ::testing::PrintToString(recorder.changes());
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(recorder.changes(), Changes({Up("n", 5), Down("n", 5), Up("n", 7), Down("n", 7),
                                         Up("n", 9), Down("n", 9), Up("done", 1)}));
  EXPECT_EQ(watcher->refused_values(), 4);
  // A listing of the same keys agrees: only `done` is a node; the two bad keys left are refused.
  Recorder listed;
  auto second = StartWatcher(listed);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(listed.changes(), Changes({Up("done", 1)}));
  EXPECT_EQ(second->refused_values(), 2);
}

}  // namespace
}  // namespace duet::etcd
