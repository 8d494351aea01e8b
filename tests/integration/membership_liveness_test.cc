// Membership liveness on loopback clusters of real processes (docs/design.md §2.9): a
// coordinator stopped (SIGSTOP) for longer than the heartbeat timeout declares no node dead when
// it resumes and serves the next request; a coordinator killed and restarted on the same port has
// every node registered again within one heartbeat interval of its return, after a short outage
// and after one long enough for gRPC's default reconnect backoff to exceed that interval.
// Each test stays under 30 s.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/model/synthetic_model.h"
#include "duet/v1/client.grpc.pb.h"
#include "proto/channel.h"
#include "tests/integration/child_process.h"
#include "tests/integration/serve_process.h"

#ifndef DUET_BIN
#error "DUET_BIN must point at the duet binary"
#endif

namespace duet {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;
using testing::ServeProcess;

// The coordinator's heartbeat interval (CoordinatorOptions' default; nodes use what it sends).
constexpr absl::Duration kHeartbeatInterval = absl::Milliseconds(500);
constexpr int kHeartbeatTimeoutMs = 1500;

v1::HealthResponse Health(v1::Generation::Stub& stub) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, absl::Milliseconds(500));
  v1::HealthResponse h;
  (void)stub.Health(&ctx, v1::HealthRequest(), &h);
  return h;
}

// node id -> epoch of every live node. A node declared dead comes back with a larger epoch, so
// equal maps before and after mean nobody was declared dead in between.
std::map<std::string, uint64_t> Epochs(const v1::HealthResponse& h) {
  std::map<std::string, uint64_t> out;
  for (const v1::NodeStatus& n : h.nodes()) out[n.node_id()] = n.epoch();
  return out;
}

absl::Status GenerateOnce(v1::Generation::Stub& stub) {
  v1::GenerateRequest req;
  for (int i = 0; i < 40; ++i) req.mutable_token_ids()->add_ids((i * 31 + 7) % 256);
  req.mutable_sampling()->set_max_tokens(6);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, absl::Seconds(20));
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse r;
  int tokens = 0;
  while (reader->Read(&r)) tokens += r.has_token() ? 1 : 0;
  const grpc::Status s = reader->Finish();
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  if (tokens != 6) return absl::InternalError(absl::StrCat(tokens, " tokens instead of 6"));
  return absl::OkStatus();
}

class MembershipLivenessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ =
        (fs::temp_directory_path() / absl::StrCat("duet_liveness_test_", getpid())).string();
    ASSERT_TRUE(model::WriteSyntheticModel("tiny", 3, model_dir_).ok());
  }
  static void TearDownTestSuite() { fs::remove_all(model_dir_); }

  static std::string model_dir_;
};
std::string MembershipLivenessTest::model_dir_;

// The coordinator stops for 4 s (more than twice its 1.5 s heartbeat timeout) and resumes: its
// own stall is not the nodes' silence, so no node is declared dead (same epochs before and
// after) and a request sent right after the resume succeeds.
TEST_F(MembershipLivenessTest, CoordinatorStallDeclaresNoNodeDead) {
  ServeProcess cluster(DUET_BIN,
                       {"--loopback", "--prefill=1", "--decode=1", "--model=" + model_dir_,
                        "--transport=shm", "--threads=1", "--kv_cache_bytes=16777216",
                        absl::StrCat("--heartbeat_timeout_ms=", kHeartbeatTimeoutMs)});
  ASSERT_TRUE(cluster.ready());
  const pid_t coordinator = cluster.pid_of("coordinator");
  ASSERT_GT(coordinator, 0);
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  ASSERT_TRUE(GenerateOnce(*stub).ok());
  const std::map<std::string, uint64_t> before = Epochs(Health(*stub));
  ASSERT_EQ(before.size(), 2u);

  ASSERT_EQ(kill(coordinator, SIGSTOP), 0);
  absl::Cleanup resume = [coordinator] { kill(coordinator, SIGCONT); };  // even on failure
  absl::SleepFor(absl::Seconds(4));
  ASSERT_EQ(kill(coordinator, SIGCONT), 0);
  const absl::Status right_after = GenerateOnce(*stub);
  EXPECT_TRUE(right_after.ok()) << "a request right after the resume: " << right_after;
  // Past one more heartbeat timeout: a node declared dead on resume would be back by now with
  // a new epoch.
  absl::SleepFor(absl::Milliseconds(kHeartbeatTimeoutMs) + kHeartbeatInterval);
  EXPECT_EQ(Epochs(Health(*stub)), before) << "a node was declared dead and re-registered";
  EXPECT_TRUE(GenerateOnce(*stub).ok());
}

// `duet coordinator` on `listen`: its client address once it printed "serving on", or "".
std::string StartCoordinator(std::unique_ptr<ChildProcess>& process, const std::string& model,
                             const std::string& listen) {
  process = std::make_unique<ChildProcess>(
      std::vector<std::string>{DUET_BIN, "coordinator", "--model=" + model, "--listen=" + listen,
                               absl::StrCat("--heartbeat_timeout_ms=", kHeartbeatTimeoutMs)});
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (std::optional<std::string> line = process->ReadLine(deadline)) {
    constexpr absl::string_view kServing = "coordinator serving on ";
    if (absl::StartsWith(*line, kServing)) return line->substr(kServing.size());
  }
  return "";
}

// Polls Health until `nodes` nodes are registered or `timeout` passed; when, or nullopt.
std::optional<absl::Time> WaitRegistered(v1::Generation::Stub& stub, int nodes,
                                         absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (Health(stub).nodes_size() == nodes) return absl::Now();
    absl::SleepFor(absl::Milliseconds(10));
  }
  return std::nullopt;
}

// Kill the coordinator (SIGKILL, as a crash), keep it away for 1 s and then 12 s, and start it
// again on the same port: both nodes are registered again within one heartbeat interval (plus
// 250 ms of margin) of its return. With gRPC's default reconnect backoff (1 s, then 1.6x per
// failed attempt, +-20% jitter) a node's attempts after the connection was lost come at about
// 1, 2.6, 5.2, 9.3 and 15.8 s: after a 12 s outage the next one is at least 0.6 s late, usually
// about 4 s.
TEST_F(MembershipLivenessTest, NodesReRegisterWithinAHeartbeatIntervalOfACoordinatorRestart) {
  std::unique_ptr<ChildProcess> coordinator;
  const std::string address = StartCoordinator(coordinator, model_dir_, "127.0.0.1:0");
  ASSERT_FALSE(address.empty());
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (const char* kind : {"prefill", "decode"}) {
    nodes.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{DUET_BIN, kind, "--coordinator=" + address,
                                 "--model=" + model_dir_, absl::StrCat("--node_id=", kind, "-0"),
                                 "--threads=1", "--kv_cache_bytes=16777216", "--transport=shm"}));
  }
  {
    auto stub = v1::Generation::NewStub(rpc::MakeChannel(address));
    ASSERT_TRUE(WaitRegistered(*stub, 2, absl::Seconds(60)).has_value());
  }
  for (absl::Duration outage : {absl::Seconds(1), absl::Seconds(12)}) {
    SCOPED_TRACE(absl::StrCat("outage ", absl::FormatDuration(outage)));
    ASSERT_EQ(kill(coordinator->pid(), SIGKILL), 0);
    coordinator->Wait(absl::Seconds(5));
    coordinator.reset();
    absl::SleepFor(outage);
    ASSERT_EQ(StartCoordinator(coordinator, model_dir_, address), address);
    const absl::Time returned = absl::Now();
    auto stub = v1::Generation::NewStub(rpc::MakeChannel(address));
    const std::optional<absl::Time> registered = WaitRegistered(*stub, 2, absl::Seconds(15));
    ASSERT_TRUE(registered.has_value()) << "nodes not back 15 s after the coordinator's return";
    std::printf("outage %s: every node registered again %s after the coordinator's return\n",
                absl::FormatDuration(outage).c_str(),
                absl::FormatDuration(*registered - returned).c_str());
    EXPECT_LE(*registered - returned, kHeartbeatInterval + absl::Milliseconds(250));
    EXPECT_TRUE(GenerateOnce(*stub).ok());
  }
}

}  // namespace
}  // namespace duet
