// MembershipClient against a scripted coordinator (in-process gRPC on 127.0.0.1): heartbeats
// name the registered incarnation, a NOT_FOUND answer makes a new incarnation, and the node
// learns each epoch before its registration is sent (its status stream answers for it).
#include "cluster/membership_client.h"

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
  bool not_found_next_ ABSL_GUARDED_BY(mu_) = false;
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
  void Start() {
    v1::RegisterRequest reg;
    reg.mutable_node()->set_node_id("decode-0");
    MembershipClientOptions o{.coordinator_address = absl::StrCat("127.0.0.1:", port_),
                              .registration = reg};
    // What the node answers for: the registrations seen so far must all have been announced.
    o.on_registering = [this](uint64_t epoch) {
      absl::MutexLock lock(&mu_);
      registering_.push_back({epoch, coordinator_.registrations()});
    };
    auto member = MembershipClient::Start(std::move(o));
    ASSERT_TRUE(member.ok()) << member.status();
    member_ = *std::move(member);
  }

  struct Registering {
    uint64_t epoch = 0;
    size_t registrations_before = 0;  // what the coordinator had received when announced
  };
  std::vector<Registering> registering() {
    absl::MutexLock lock(&mu_);
    return registering_;
  }

  FakeCoordinator coordinator_;
  absl::Mutex mu_;
  std::vector<Registering> registering_ ABSL_GUARDED_BY(mu_);
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MembershipClient> member_;
};

TEST_F(MembershipClientTest, HeartbeatsNameTheIncarnationAndCarryNothingElse) {
  Start();
  ASSERT_GE(coordinator_.WaitFor(
                0, [](const v1::HeartbeatRequest&) { return true; }, absl::Seconds(3)),
            0);
  for (const FakeCoordinator::Beat& b : coordinator_.heartbeats()) {
    EXPECT_EQ(b.req.node().node_id(), "decode-0");
    EXPECT_EQ(b.req.node().epoch(), member_->epoch());
  }
  // The epoch was announced before its registration was sent.
  const std::vector<Registering> r = registering();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].epoch, member_->epoch());
  EXPECT_EQ(r[0].registrations_before, 0u);
  EXPECT_EQ(coordinator_.registration(0).node().epoch(), r[0].epoch);
}

TEST_F(MembershipClientTest, ANewIncarnationFollowsNotFound) {
  Start();
  const uint64_t old_epoch = member_->epoch();
  coordinator_.AnswerNotFound();  // the next heartbeat is refused: the client registers again
  const int i = coordinator_.WaitFor(
      0, [old_epoch](const v1::HeartbeatRequest& r) { return r.node().epoch() > old_epoch; });
  ASSERT_GE(i, 0);
  EXPECT_EQ(coordinator_.registrations(), 2u);
  EXPECT_GT(member_->epoch(), old_epoch);
  EXPECT_EQ(coordinator_.heartbeats()[i].req.node().epoch(), member_->epoch());
  const std::vector<Registering> r = registering();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1].epoch, member_->epoch());
  EXPECT_EQ(r[1].registrations_before, 1u);
  EXPECT_EQ(coordinator_.registration(1).node().epoch(), r[1].epoch);
}

}  // namespace
}  // namespace duet::cluster
