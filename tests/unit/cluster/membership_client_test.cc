// MembershipClient against a scripted coordinator (in-process gRPC on 127.0.0.1): the prefix
// cache's snapshot goes with the first heartbeat of every incarnation and whenever the
// coordinator asks, and new events go out promptly, not once per heartbeat interval.
#include "cluster/membership_client.h"

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/channel.h"

namespace duet::cluster {
namespace {

class FakeCoordinator final : public v1::Membership::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override {
    absl::MutexLock lock(&mu_);
    registrations_.push_back(*req);
    resp->set_heartbeat_interval_ms(1000);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    absl::MutexLock lock(&mu_);
    heartbeats_.push_back({*req, absl::Now()});
    if (not_found_next_) {
      not_found_next_ = false;
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "declared dead");
    }
    resp->set_want_kv_snapshot(want_snapshot_next_);
    want_snapshot_next_ = false;
    return grpc::Status::OK;
  }
  grpc::Status Deregister(grpc::ServerContext*, const v1::DeregisterRequest*,
                          v1::DeregisterResponse*) override {
    return grpc::Status::OK;
  }

  struct Beat {
    v1::HeartbeatRequest req;
    absl::Time at;
  };
  std::vector<Beat> heartbeats() {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  size_t registrations() {
    absl::MutexLock lock(&mu_);
    return registrations_.size();
  }
  v1::RegisterRequest registration(size_t i) {
    absl::MutexLock lock(&mu_);
    return registrations_.at(i);
  }
  void AnswerWantSnapshot() {
    absl::MutexLock lock(&mu_);
    want_snapshot_next_ = true;
  }
  void AnswerNotFound() {
    absl::MutexLock lock(&mu_);
    not_found_next_ = true;
  }
  // Waits until a heartbeat after the first `after` matches `pred`; its index, or -1.
  template <typename Pred>
  int WaitFor(size_t after, Pred pred, absl::Duration timeout = absl::Seconds(5)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      std::vector<Beat> beats = heartbeats();
      for (size_t i = after; i < beats.size(); ++i) {
        if (pred(beats[i].req)) return static_cast<int>(i);
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return -1;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::RegisterRequest> registrations_ ABSL_GUARDED_BY(mu_);
  std::vector<Beat> heartbeats_ ABSL_GUARDED_BY(mu_);
  bool want_snapshot_next_ ABSL_GUARDED_BY(mu_) = false;
  bool not_found_next_ ABSL_GUARDED_BY(mu_) = false;
};

// A node's cache as the client sees it: events queued by the test, snapshots counted.
class FakeCache {
 public:
  void Store(uint64_t h) {
    absl::MutexLock lock(&mu_);
    pending_.push_back(h);
  }
  v1::KvEvents Events(bool snapshot) {
    absl::MutexLock lock(&mu_);
    v1::KvEvents e;
    if (snapshot) {
      ++snapshots_;
      e.set_snapshot(true);
      pending_.clear();
      e.set_first_seq(next_seq_);
      return e;
    }
    e.set_first_seq(next_seq_);
    for (uint64_t h : pending_) e.add_events()->set_hash_low(h);
    next_seq_ += pending_.size();
    pending_.clear();
    return e;
  }
  int snapshots() {
    absl::MutexLock lock(&mu_);
    return snapshots_;
  }

 private:
  absl::Mutex mu_;
  std::deque<uint64_t> pending_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int snapshots_ ABSL_GUARDED_BY(mu_) = 0;
};

class MembershipClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = rpc::StartServer("127.0.0.1:0", {&coordinator_}, &port_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    member_.reset();
    server_->Shutdown();
  }
  void Start(bool cache) {
    v1::RegisterRequest reg;
    reg.mutable_node()->set_node_id("decode-0");
    reg.mutable_prefix_cache()->set_enabled(cache);
    MembershipClientOptions o{.coordinator_address = absl::StrCat("127.0.0.1:", port_),
                              .registration = reg};
    if (cache) o.kv_events = [this](bool snapshot) { return cache_.Events(snapshot); };
    auto member = MembershipClient::Start(std::move(o));
    ASSERT_TRUE(member.ok()) << member.status();
    member_ = *std::move(member);
  }

  FakeCoordinator coordinator_;
  FakeCache cache_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MembershipClient> member_;
};

bool IsSnapshot(const v1::HeartbeatRequest& r) {
  return r.has_kv_events() && r.kv_events().snapshot();
}

TEST_F(MembershipClientTest, FirstHeartbeatCarriesASnapshotAndEventsGoOutPromptly) {
  const absl::Time start = absl::Now();
  Start(/*cache=*/true);
  EXPECT_TRUE(coordinator_.registration(0).prefix_cache().enabled());
  const int first = coordinator_.WaitFor(0, IsSnapshot);
  ASSERT_EQ(first, 0) << "the first heartbeat must carry the snapshot";
  EXPECT_LT(coordinator_.heartbeats()[0].at - start, absl::Milliseconds(500));
  // Within one heartbeat interval (1 s), the events go out on their own heartbeat.
  const size_t before = coordinator_.heartbeats().size();
  const absl::Time stored = absl::Now();
  cache_.Store(7);
  cache_.Store(8);
  const int i = coordinator_.WaitFor(
      before, [](const v1::HeartbeatRequest& r) { return r.kv_events().events_size() > 0; });
  ASSERT_GE(i, 0);
  const FakeCoordinator::Beat beat = coordinator_.heartbeats()[i];
  EXPECT_LT(beat.at - stored, absl::Milliseconds(500));
  EXPECT_FALSE(beat.req.kv_events().snapshot());
  ASSERT_EQ(beat.req.kv_events().events_size(), 2);
  EXPECT_EQ(beat.req.kv_events().events(0).hash_low(), 7u);
  EXPECT_EQ(cache_.snapshots(), 1);
}

TEST_F(MembershipClientTest, ASnapshotFollowsWhenTheCoordinatorAsks) {
  Start(/*cache=*/true);
  ASSERT_EQ(coordinator_.WaitFor(0, IsSnapshot), 0);
  coordinator_.AnswerWantSnapshot();
  const size_t before = coordinator_.heartbeats().size();
  cache_.Store(1);  // an early heartbeat, answered with want_kv_snapshot
  const int i = coordinator_.WaitFor(before, IsSnapshot);
  ASSERT_GE(i, 0);
  EXPECT_EQ(cache_.snapshots(), 2);
}

TEST_F(MembershipClientTest, ANewIncarnationStartsFromASnapshot) {
  Start(/*cache=*/true);
  ASSERT_EQ(coordinator_.WaitFor(0, IsSnapshot), 0);
  const uint64_t old_epoch = member_->epoch();
  coordinator_.AnswerNotFound();
  const size_t before = coordinator_.heartbeats().size();
  cache_.Store(1);  // its heartbeat is refused: the client registers again
  const int i = coordinator_.WaitFor(before + 1, IsSnapshot);
  ASSERT_GE(i, 0);
  EXPECT_EQ(coordinator_.registrations(), 2u);
  EXPECT_GT(member_->epoch(), old_epoch);
  EXPECT_EQ(coordinator_.heartbeats()[i].req.node().epoch(), member_->epoch());
}

TEST_F(MembershipClientTest, WithoutACacheHeartbeatsCarryNoEvents) {
  Start(/*cache=*/false);
  ASSERT_GE(coordinator_.WaitFor(
                0, [](const v1::HeartbeatRequest&) { return true; }, absl::Seconds(3)),
            0);
  for (const FakeCoordinator::Beat& b : coordinator_.heartbeats()) {
    EXPECT_FALSE(b.req.has_kv_events());
  }
  EXPECT_FALSE(coordinator_.registration(0).prefix_cache().enabled());
}

}  // namespace
}  // namespace duet::cluster
