// StatusWatchers against a scripted node (in-process gRPC on 127.0.0.1): every message of the
// watched incarnation is applied, a stream that ends or goes silent is reported at once and
// opened again after the backoff, and Forget ends it for good.
#include "coordinator/status_watchers.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/channel.h"

namespace duet::coordinator {
namespace {

// Each Watch sends one snapshot of `epoch`, then ends the stream or stays silent until the
// caller goes away.
class ScriptedNode final : public v1::NodeStatusStream::Service {
 public:
  grpc::Status Watch(grpc::ServerContext* ctx, const v1::WatchStatusRequest* req,
                     grpc::ServerWriter<v1::StatusUpdate>* writer) override {
    bool silent = false;
    {
      absl::MutexLock lock(&mu_);
      ++watches_;
      silent = silent_;
    }
    v1::StatusUpdate u;
    u.mutable_node()->set_node_id("decode-0");
    u.mutable_node()->set_epoch(req->node().epoch());
    u.mutable_load()->set_total_blocks(8);
    u.mutable_kv_events()->set_snapshot(true);
    if (!writer->Write(u)) return grpc::Status::CANCELLED;
    if (!silent) return grpc::Status::OK;  // the node ends the stream
    while (!ctx->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
    return grpc::Status::CANCELLED;
  }
  int watches() {
    absl::MutexLock lock(&mu_);
    return watches_;
  }
  void set_silent(bool silent) {
    absl::MutexLock lock(&mu_);
    silent_ = silent;
  }

 private:
  absl::Mutex mu_;
  int watches_ ABSL_GUARDED_BY(mu_) = 0;
  bool silent_ ABSL_GUARDED_BY(mu_) = false;
};

class StatusWatchersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = rpc::StartServer("127.0.0.1:0", {&node_}, &port_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    watchers_ = std::make_unique<StatusWatchers>(
        StatusWatchOptions{.silence_timeout = absl::Milliseconds(300),
                           .initial_backoff = absl::Milliseconds(50),
                           .max_backoff = absl::Milliseconds(100)},
        StatusWatchCallbacks{.on_update =
                                 [this](const NodeIncarnation& n, const v1::StatusUpdate& u) {
                                   absl::MutexLock lock(&mu_);
                                   EXPECT_EQ(u.node().epoch(), n.epoch);
                                   updated_.push_back(n);
                                   return absl::OkStatus();
                                 },
                             .on_break =
                                 [this](const NodeIncarnation& n, const absl::Status& why) {
                                   absl::MutexLock lock(&mu_);
                                   EXPECT_EQ(n, kNode);  // only the node of the tests that break
                                   breaks_.push_back(why);
                                 }});
  }
  void TearDown() override {
    watchers_->StopAll();
    server_->Shutdown();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int updates() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(updated_.size());
  }
  std::vector<NodeIncarnation> updated() {
    absl::MutexLock lock(&mu_);
    return updated_;
  }
  std::vector<absl::Status> breaks() {
    absl::MutexLock lock(&mu_);
    return breaks_;
  }
  template <typename Pred>
  bool WaitFor(Pred pred, absl::Duration timeout = absl::Seconds(5)) {
    for (absl::Time d = absl::Now() + timeout; absl::Now() < d;) {
      if (pred()) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return pred();
  }

  const NodeIncarnation kNode{"decode-0", 3};
  ScriptedNode node_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<StatusWatchers> watchers_;
  absl::Mutex mu_;
  std::vector<NodeIncarnation> updated_ ABSL_GUARDED_BY(mu_);  // whose messages were applied
  std::vector<absl::Status> breaks_ ABSL_GUARDED_BY(mu_);
};

TEST_F(StatusWatchersTest, AnEndedStreamIsReportedAndOpenedAgainUntilForgotten) {
  watchers_->Watch(kNode, address());
  ASSERT_TRUE(WaitFor([&] { return node_.watches() >= 3 && updates() >= 3; }));
  std::vector<absl::Status> b = breaks();
  ASSERT_GE(b.size(), 2u);
  EXPECT_EQ(b[0].code(), absl::StatusCode::kUnavailable) << b[0];
  EXPECT_NE(b[0].message().find("ended its status stream"), std::string::npos) << b[0];
  watchers_->Forget(kNode);
  const int watches = node_.watches();
  absl::SleepFor(absl::Milliseconds(300));  // three backoffs
  EXPECT_EQ(node_.watches(), watches);
}

TEST_F(StatusWatchersTest, ASilentStreamIsBrokenBySilenceTimeout) {
  node_.set_silent(true);
  watchers_->Watch(kNode, address());
  ASSERT_TRUE(WaitFor([&] { return updates() == 1; }));
  const absl::Time start = absl::Now();
  ASSERT_TRUE(WaitFor([&] {
    watchers_->CheckSilence(absl::Now());  // as the coordinator's timer does
    return !breaks().empty();
  }));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_EQ(breaks()[0].code(), absl::StatusCode::kDeadlineExceeded) << breaks()[0];
  // Opened again: another snapshot arrives.
  EXPECT_TRUE(WaitFor([&] { return updates() >= 2; }));
  ASSERT_EQ(watchers_->LastApplied().size(), 1u);
  EXPECT_GT(watchers_->LastApplied()[0].second, start);
}

TEST_F(StatusWatchersTest, ANewIncarnationReplacesTheStreamOfTheOld) {
  node_.set_silent(true);
  watchers_->Watch({"decode-0", 2}, address());
  ASSERT_TRUE(WaitFor([&] { return node_.watches() == 1; }));
  watchers_->Watch(kNode, address());  // the old one's stream ends; this one's opens
  ASSERT_TRUE(WaitFor([&] { return node_.watches() == 2 && updates() >= 2; }));
  watchers_->Forget({"decode-0", 2});  // stale: leaves the current one alone
  absl::SleepFor(absl::Milliseconds(100));
  const std::vector<NodeIncarnation> u = updated();
  ASSERT_EQ(u.size(), 2u);  // one snapshot each, nothing more from the old one
  EXPECT_EQ(u[0], (NodeIncarnation{"decode-0", 2}));
  EXPECT_EQ(u[1], kNode);
  ASSERT_EQ(watchers_->LastApplied().size(), 1u);
  EXPECT_NE(watchers_->LastApplied()[0].second, absl::InfinitePast());
  EXPECT_TRUE(breaks().empty());  // replaced, not broken
  // The current one's stream is still open: Forget of it ends it.
  watchers_->Forget(kNode);
  EXPECT_TRUE(watchers_->LastApplied().empty());
}

}  // namespace
}  // namespace duet::coordinator
