// deploy/haproxy.cfg as shipped (only its addresses replaced by loopback ones), run by the real
// HAProxy in front of two `duet serve --colocated` servers' HTTP APIs: requests are spread over
// both servers; a streamed chat completion arrives token by token, not at once; a server killed
// with SIGKILL costs no request that had not reached it (connection failures are retried on the
// other server) and is taken out after fall x inter, and once restarted it is taken back after
// rise x inter. Each test skips when no haproxy is installed.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/model/synthetic_model.h"
#include "nlohmann/json.hpp"
#include "tests/integration/free_port.h"
#include "tests/integration/haproxy_process.h"
#include "tests/integration/lb_client.h"
#include "tests/integration/serve_process.h"

#ifndef DUET_BIN
#error "DUET_BIN must point at the duet binary"
#endif
#ifndef DUET_SOURCE_DIR
#error "DUET_SOURCE_DIR must point at the repository"
#endif

namespace duet {
namespace {

namespace fs = std::filesystem;
using testing::HaproxyProcess;
using testing::PostStream;
using testing::ServeProcess;
using testing::Stream;

constexpr char kBackend[] = "duet_coordinators";
const char* const kServers[2] = {"coordinator-0", "coordinator-1"};
// The shipped addresses of those servers, replaced by the test's.
const char* const kShippedAddresses[2] = {"10.0.0.10:8000", "10.0.0.11:8000"};
// The shipped health-check timing (asserted to be in the file): inter 2 s, fall 2, rise 2.
constexpr char kCheckTiming[] = "inter 2s fall 2 rise 2";
constexpr absl::Duration kInter = absl::Seconds(2);
constexpr int kFall = 2;
constexpr int kRise = 2;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One `duet serve --colocated` with its HTTP API on a fixed port (the same after a restart).
class Backend {
 public:
  Backend(std::string model_dir, int http_port)
      : model_dir_(std::move(model_dir)), http_port_(http_port) {}

  bool Start() {
    process_ = std::make_unique<ServeProcess>(
        DUET_BIN,
        std::vector<std::string>{"--colocated", "--model=" + model_dir_, "--threads=1",
                                 "--kv_cache_bytes=16777216", "--max_batch_tokens=64",
                                 "--max_running=16", absl::StrCat("--http_port=", http_port_)});
    return process_->ready();
  }
  void Kill() {
    ASSERT_NE(process_, nullptr);
    const pid_t pid = process_->pid_of("colocated-0");
    ASSERT_GT(pid, 0);
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    process_.reset();  // reaps it
  }
  int http_port() const { return http_port_; }

  // This server's own /metrics; "" when the scrape fails.
  std::string Metrics() const { return testing::ScrapeMetrics(http_port_); }
  double Completions() const { return testing::HttpRequests(http_port_, "/v1/completions", 200); }

 private:
  std::string model_dir_;
  int http_port_;
  std::unique_ptr<ServeProcess> process_;
};

// POST /v1/completions through `port`: the status (0 when there was no response) and body.
std::pair<int, std::string> Complete(int port, int max_tokens = 4) {
  return testing::PostJson(
      port, "/v1/completions",
      {{"prompt", "Hello"}, {"max_tokens", max_tokens}, {"ignore_eos", true}, {"temperature", 0}});
}

class HaproxyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ =
        (fs::temp_directory_path() / absl::StrCat("duet_haproxy_test_", getpid())).string();
    // Wider and deeper than "tiny", so that a token takes milliseconds: a stream lasts long
    // enough to be seen arriving, and to be cut by a kill.
    model::SyntheticOverrides o;
    o.num_layers = 6;
    o.hidden = 512;
    o.intermediate = 1536;
    o.num_heads = 8;
    o.num_kv_heads = 4;
    o.head_dim = 64;
    ASSERT_TRUE(model::WriteSyntheticModel("tiny", 3, model_dir_, o).ok());
  }
  static void TearDownTestSuite() { fs::remove_all(model_dir_); }

  void SetUp() override {
    binary_ = HaproxyProcess::FindBinary();
    if (binary_.empty()) GTEST_SKIP() << HaproxyProcess::kMissing;
    shipped_ = ReadFile(std::string(DUET_SOURCE_DIR) + "/deploy/haproxy.cfg");
    ASSERT_FALSE(shipped_.empty());
    ASSERT_TRUE(absl::StrContains(shipped_, kCheckTiming))
        << "deploy/haproxy.cfg no longer checks with " << kCheckTiming << ": update this test";
    for (int i = 0; i < 2; ++i) {
      backends_.push_back(std::make_unique<Backend>(model_dir_, testing::FreeLoopbackPort()));
      ASSERT_TRUE(backends_.back()->Start()) << "backend " << i << " did not start";
    }
    testing::HaproxyOptions options{.api_bind = "bind :8000", .stats_bind = "bind :8404"};
    for (int i = 0; i < 2; ++i) {
      options.replace[kShippedAddresses[i]] = absl::StrCat("127.0.0.1:", backends_[i]->http_port());
    }
    absl::StatusOr<std::unique_ptr<HaproxyProcess>> lb =
        HaproxyProcess::Start(binary_, shipped_, options);
    ASSERT_TRUE(lb.ok()) << lb.status();
    lb_ = *std::move(lb);
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(WaitUp(i, true, absl::Seconds(15))) << kServers[i] << " never UP";
    }
  }

  // Waits (at most `timeout`) until HAProxy holds server `i` UP (`up`) or not.
  bool WaitUp(int i, bool up, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      absl::StatusOr<bool> is_up = lb_->ServerUp(kBackend, kServers[i]);
      EXPECT_TRUE(is_up.ok()) << is_up.status();
      if (is_up.ok() && *is_up == up) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  static std::string model_dir_;
  std::string binary_;
  std::string shipped_;
  std::vector<std::unique_ptr<Backend>> backends_;
  std::unique_ptr<HaproxyProcess> lb_;
};

std::string HaproxyTest::model_dir_;

// (a) Concurrent requests through HAProxy are all answered, and both servers answer some of
// them (each server's own request counter), none twice.
TEST_F(HaproxyTest, SpreadsRequestsOverBothServers) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 6;
  std::atomic<int> ok{0};
  std::vector<std::jthread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        const auto [status, body] = Complete(lb_->api_port(), 16);
        EXPECT_EQ(status, 200) << body;
        if (status == 200) ++ok;
      }
    });
  }
  for (std::jthread& t : threads) t.join();
  EXPECT_EQ(ok.load(), kThreads * kPerThread);
  const double a = backends_[0]->Completions();
  const double b = backends_[1]->Completions();
  EXPECT_GE(a, 1) << "server 0 answered none";
  EXPECT_GE(b, 1) << "server 1 answered none";
  EXPECT_EQ(a + b, kThreads * kPerThread);
}

// (b) A streamed chat completion through HAProxy arrives as many SSE events spread over the
// generation: the first well before the last (HAProxy does not hold the response back).
TEST_F(HaproxyTest, StreamsServerSentEventsUnbuffered) {
  const nlohmann::json body = {{"messages", {{{"role", "user"}, {"content", "Hello"}}}},
                               {"max_tokens", 400},
                               {"ignore_eos", true},
                               {"stream", true}};
  const Stream s = PostStream(lb_->api_port(), "/v1/chat/completions", body.dump(), nullptr);
  ASSERT_EQ(s.status, 200) << s.all.substr(0, 500);
  ASSERT_TRUE(s.done) << s.all.substr(0, 500);
  ASSERT_GE(s.event_times.size(), 10u) << s.all.substr(0, 500);
  const absl::Duration first = s.event_times.front();
  const absl::Duration last = s.event_times.back();
  int distinct = 1;
  for (size_t i = 1; i < s.event_times.size(); ++i) {
    if (s.event_times[i] != s.event_times[i - 1]) ++distinct;
  }
  // Token by token: many events in a read of their own (held back and merged, they come in a
  // few bursts).
  EXPECT_GE(distinct, static_cast<int>(s.event_times.size()) / 4)
      << s.event_times.size() << " events arrived in only " << distinct << " reads";
  EXPECT_LT(first, last / 2) << "first event after " << absl::FormatDuration(first)
                             << ", last after " << absl::FormatDuration(last);
  std::printf("stream through haproxy: %zu events in %d reads, first %s, last %s\n",
              s.event_times.size(), distinct, absl::FormatDuration(first).c_str(),
              absl::FormatDuration(last).c_str());
}

// (c) SIGKILL of the server that runs a stream: that stream ends cut (its response had begun:
// never retried), but every request sent after the kill is answered, including those HAProxy
// sends to the dead server before its checks notice (the connection is refused: retried on the
// other server). After fall x inter the dead server is DOWN and everything goes to the survivor.
// (d) Restarted on the same port, it is UP again after rise x inter and answers requests again.
TEST_F(HaproxyTest, KilledServerIsRetriedAroundTakenOutAndTakenBack) {
  // A long stream in flight; the server running it is the one killed.
  const nlohmann::json stream_body = {
      {"prompt", "Hello"}, {"max_tokens", 1300}, {"ignore_eos", true}, {"stream", true}};
  std::atomic<bool> streaming{false};
  Stream cut;
  std::jthread streamer([&] {
    cut = PostStream(lb_->api_port(), "/v1/completions", stream_body.dump(), nullptr,
                     absl::Seconds(60), &streaming);
  });
  const absl::Time stream_deadline = absl::Now() + absl::Seconds(30);
  while (!streaming.load() && absl::Now() < stream_deadline) absl::SleepFor(absl::Milliseconds(10));
  if (!streaming.load()) {
    streamer.join();
    FAIL() << "the stream never began: " << cut.all.substr(0, 1000);
  }
  int victim = -1;
  for (int i = 0; i < 2; ++i) {
    if (absl::StrContains(backends_[i]->Metrics(), "duet_http_active_generations 1")) victim = i;
  }
  ASSERT_NE(victim, -1) << "no server runs the stream";
  const int survivor = 1 - victim;
  const double survivor_before = backends_[survivor]->Completions();

  backends_[victim]->Kill();
  const absl::Time killed = absl::Now();
  streamer.join();
  EXPECT_FALSE(cut.done) << "the stream on the killed server ended normally";

  // Requests until the checks took it out, and a while after.
  int sent = 0;
  int failed = 0;
  absl::Duration detected = absl::InfiniteDuration();
  while (absl::Now() < killed + kInter * (kFall + 2)) {
    const auto [status, body] = Complete(lb_->api_port());
    ++sent;
    if (status != 200) {
      ++failed;
      ADD_FAILURE() << "request " << sent << " after the kill: " << status << " " << body;
    }
    absl::StatusOr<bool> up = lb_->ServerUp(kBackend, kServers[victim]);
    ASSERT_TRUE(up.ok()) << up.status();
    if (!*up && detected == absl::InfiniteDuration()) detected = absl::Now() - killed;
  }
  // Some of them were sent to the dead server before it was DOWN, and redispatched.
  absl::StatusOr<double> redispatched = lb_->Metric(
      absl::StrCat("haproxy_backend_redispatch_warnings_total{proxy=\"", kBackend, "\"}"));
  ASSERT_TRUE(redispatched.ok()) << redispatched.status();
  std::printf(
      "after the kill: %d requests, %d failed, %.0f redispatched; the dead server DOWN after "
      "%s\n",
      sent, failed, *redispatched, absl::FormatDuration(detected).c_str());
  EXPECT_EQ(failed, 0);
  EXPECT_GE(*redispatched, 1) << "no request met the dead server: the window was not tested";
  // Taken out within fall x inter (plus one interval: the kill falls between two checks).
  EXPECT_LE(detected, kInter * (kFall + 1)) << "the dead server was not taken out";
  EXPECT_EQ(backends_[survivor]->Completions() - survivor_before, sent)
      << "not every request went to the survivor";

  // (d) Back on the same port: UP again after rise x inter, and served requests again.
  ASSERT_TRUE(backends_[victim]->Start()) << "the killed server did not restart";
  const absl::Time restarted = absl::Now();
  ASSERT_TRUE(WaitUp(victim, true, kInter * (kRise + 2))) << "the restarted server not taken back";
  const absl::Duration back = absl::Now() - restarted;
  std::printf("the restarted server UP after %s\n", absl::FormatDuration(back).c_str());
  EXPECT_GE(back, kInter * (kRise - 1)) << "taken back before rise x inter";
  constexpr int kThreads = 4;
  std::vector<std::jthread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 3; ++i) {
        const auto [status, body] = Complete(lb_->api_port(), 16);
        EXPECT_EQ(status, 200) << body;
      }
    });
  }
  for (std::jthread& t : threads) t.join();
  EXPECT_GE(backends_[victim]->Completions(), 1) << "the restarted server answered none";
}

}  // namespace
}  // namespace duet
