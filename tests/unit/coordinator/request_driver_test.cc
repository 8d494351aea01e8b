// RequestDriver (coordinator/request_driver.h) against scripted nodes (fake_nodes.h): the real
// registry, router, tracker, directory and effects, and the driver's own threads, without a
// network. A timer thread expires the tracker's deadlines as the coordinator's does.
#include "coordinator/request_driver.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/base/error_reason.h"
#include "coordinator/active_requests.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/fake_nodes.h"

namespace duet::coordinator {
namespace {

using testing::Admitted;
using testing::FakeNodes;
using testing::FirstToken;
using testing::Landed;
using testing::PrefillScript;
using testing::Scheduled;
using testing::StreamScript;
using testing::Token;

constexpr int kPromptTokens = 20;

kv::KvLayout Layout() {
  return kv::KvLayout{.model_id = "tiny",
                      .num_layers = 2,
                      .num_kv_heads = 2,
                      .head_dim = 16,
                      .block_size = 16,
                      .dtype = kv::KvDtype::kF32};
}

struct Result {
  absl::Status status;
  std::vector<v1::GenerateResponse> responses;
  std::vector<bool> scheduled;  // each GenerateSink::scheduled call, in order
  std::vector<int32_t> Tokens() const {
    std::vector<int32_t> out;
    for (const v1::GenerateResponse& r : responses) {
      if (r.has_token()) out.push_back(r.token_id());
    }
    return out;
  }
};

class Rig {
 public:
  explicit Rig(TrackerOptions options) : tracker_(options, &directory_) {
    timer_ = std::thread([this] {
      while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(10))) {
        active_.Apply(tracker_.ExpireDeadlines(absl::Now()));
      }
    });
  }
  ~Rig() {
    stop_.Notify();
    timer_.join();
    background_.DrainAll();
  }

  // `queued_tokens`: a prefill node's queue as of its last heartbeat (the router prefers the
  // shortest, so a busy node is picked only when the others are excluded).
  void AddNode(const std::string& id, NodeKind kind, int64_t queued_tokens = 0) {
    NodeRegistration r;
    r.node = {id, 1};
    r.kind = kind;
    r.address = id;  // the fake's key
    r.transfer_address = id + "-transfer";
    r.layout = Layout();
    r.compute = {.backend = "cpu", .cpu_gemm = "invariant", .threads = 1};
    r.capacity = {.total_blocks = 100, .max_running_requests = 8};
    r.load = {.free_blocks = 100, .total_blocks = 100, .queued_tokens = queued_tokens};
    ASSERT_TRUE(registry_.Register(r, absl::Now()).ok());
  }

  // Runs one request to its end (giving up, as a client that went away, after `limit`).
  Result Generate(absl::Duration limit = absl::Seconds(10)) {
    Result out;
    std::atomic<bool> gave_up{false};
    http::GenerateSink sink{.write =
                                [&](const v1::GenerateResponse& r) {
                                  out.responses.push_back(r);
                                  if (on_write) on_write(r);
                                  return true;
                                },
                            .cancelled = [&] { return gave_up.load(); },
                            .scheduled = [&](bool running) { out.scheduled.push_back(running); }};
    DriverRequest request{.id = "r1"};
    for (int i = 0; i < kPromptTokens; ++i) request.prompt.push_back(100 + i);
    request.sampling.set_max_tokens(8);
    EXPECT_TRUE(tracker_.Start(request.id, absl::Now()).ok());
    auto driver = std::make_shared<RequestDriver>(Env(), request, sink);
    active_.Add(driver);
    absl::Notification done;
    std::thread run([&] {
      out.status = driver->Run();
      done.Notify();
    });
    if (!done.WaitForNotificationWithTimeout(limit)) {
      ADD_FAILURE() << "the driver did not end within " << limit;
      gave_up = true;
    }
    run.join();
    active_.Remove(request.id);
    background_.DrainAll();
    return out;
  }

  DriverEnv Env() {
    return DriverEnv{.max_position_embeddings = 4096,
                     .registry = &registry_,
                     .directory = &directory_,
                     .prefix_index = &prefix_index_,
                     .tracker = &tracker_,
                     .router = &router_,
                     .routes = &routes_,
                     .active = &active_,
                     .calls = &nodes,
                     .background = &background_,
                     .metrics = &metrics_};
  }

  std::function<void(const v1::GenerateResponse&)> on_write;  // after each client write
  FakeNodes nodes;                                            // outlives background_'s calls
  NodeRegistry registry_{{.heartbeat_timeout = absl::Hours(1)}};
  CacheDirectory directory_;
  PrefixIndex prefix_index_;
  RequestTracker tracker_;
  Router router_{RouterMode::kLoad};  // least loaded; ties by node id (p0 before p1)
  RouteBook routes_{&registry_};
  BackgroundCalls background_;
  ActiveRequests active_{&registry_, &nodes, &background_};
  CoordinatorMetrics metrics_;
  absl::Notification stop_;
  std::thread timer_;
};

// A P that answers: scheduled, its first token (once `after`, if set, is notified), then the KV
// landed.
FakeNodes::PrefillFn Answers(int32_t first, absl::Notification* after = nullptr) {
  return [first, after](int, const v1::PrefillRequest&) {
    return PrefillScript{.steps = {Scheduled(), FirstToken(first, after), Landed(1234)}};
  };
}
FakeNodes::PrefillFn Hangs(absl::Notification* never) {
  return [never](int, const v1::PrefillRequest&) {
    return PrefillScript{.steps = {testing::Hang<v1::PrefillResponse>(never)}};
  };
}
// D's stream: admitted, tokens 1..n-1 (first + i), the last one finishing (MAX_TOKENS).
StreamScript Decodes(int32_t first, int n, std::function<void()> on_finish = nullptr) {
  StreamScript s{.steps = {Admitted()}, .on_finish = std::move(on_finish)};
  for (int i = 1; i < n; ++i) {
    s.steps.push_back(Token(
        first + i, i, i + 1 == n ? v1::FINISH_REASON_MAX_TOKENS : v1::FINISH_REASON_UNSPECIFIED));
  }
  return s;
}

void ExpectEverythingEnded(Rig& rig) {
  EXPECT_EQ(rig.nodes.active_calls.load(), 0) << "a call of the request still runs";
  EXPECT_EQ(rig.nodes.live_streams.load(), 0);
  EXPECT_EQ(rig.tracker_.size(), 0u);
  EXPECT_EQ(rig.directory_.size(), 0u);
}

TEST(ClassifyReserveTest, ReadsTheReasonAndTheCodeNeverTheMessage) {
  // The words of each message point the wrong way: only the reason and code may decide.
  EXPECT_EQ(ClassifyReserve(absl::OkStatus()), ReserveOutcome::kReserved);
  EXPECT_EQ(ClassifyReserve(WithReason(absl::UnavailableError("deadline exceeded, no room"),
                                       ErrorReason::kSenderUnreachable)),
            ReserveOutcome::kSenderRefused);
  EXPECT_EQ(ClassifyReserve(WithReason(absl::FailedPreconditionError("unreachable"),
                                       ErrorReason::kSenderFenced)),
            ReserveOutcome::kSenderRefused);
  EXPECT_EQ(ClassifyReserve(absl::UnavailableError("sender fenced")),
            ReserveOutcome::kDecodeSilent);
  EXPECT_EQ(ClassifyReserve(absl::DeadlineExceededError("resource exhausted")),
            ReserveOutcome::kDecodeSilent);
  EXPECT_EQ(ClassifyReserve(absl::ResourceExhaustedError("unavailable")), ReserveOutcome::kNoRoom);
  EXPECT_EQ(ClassifyReserve(absl::FailedPreconditionError("layout mismatch")),
            ReserveOutcome::kFailed);
}

// P's first token, then D's tokens and finish, in order, even when D's events arrive first
// (here all of them, finish included, before P answers: held, then replayed).
TEST(RequestDriverTest, HappyPathFirstTokenFromPrefillThenDecodeTokensThenFinish) {
  Rig rig(TrackerOptions{});
  rig.AddNode("p0", NodeKind::kPrefill);
  rig.AddNode("d0", NodeKind::kDecode);
  absl::Notification d_done;
  rig.nodes.SetPrefill("p0", Answers(10, &d_done));
  rig.nodes.SetStream("d0", [&](int) { return Decodes(10, 4, [&] { d_done.Notify(); }); });

  Result r = rig.Generate();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.Tokens(), (std::vector<int32_t>{10, 11, 12, 13}));
  ASSERT_EQ(r.responses.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r.responses[i].index(), i);
  EXPECT_EQ(r.scheduled, std::vector<bool>{true});  // P's scheduled message, once
  const v1::GenerateResponse& last = r.responses.back();
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_MAX_TOKENS);
  EXPECT_EQ(last.prompt_tokens(), kPromptTokens);
  EXPECT_EQ(last.timings().prefill_attempts(), 1);
  EXPECT_EQ(last.timings().kv_bytes_sent(), 1234);  // P's last message, waited for
  ASSERT_EQ(rig.nodes.reserve_requests().size(), 1u);
  EXPECT_EQ(rig.nodes.reserve_requests()[0].sender_node_id(), "p0");
  EXPECT_TRUE(rig.nodes.releases().empty());  // D freed it by finishing
  ExpectEverythingEnded(rig);
}

// P fails before answering: the reservation is released and the request re-routed to the other
// prefill node, which serves it.
TEST(RequestDriverTest, PrefillNodeFailingBeforeItsFirstTokenIsReplacedByAnother) {
  Rig rig(TrackerOptions{});
  rig.AddNode("p0", NodeKind::kPrefill);
  rig.AddNode("p1", NodeKind::kPrefill, /*queued_tokens=*/1000);
  rig.AddNode("d0", NodeKind::kDecode);
  absl::Notification never;
  rig.nodes.SetPrefill("p0", [](int, const v1::PrefillRequest&) {
    return PrefillScript{.steps = {testing::Fail<v1::PrefillResponse>(
                             absl::InternalError("Prefill on p0@1: out of scratch memory"))}};
  });
  rig.nodes.SetPrefill("p1", Answers(20));
  rig.nodes.SetStream("d0", [&](int call) {
    if (call == 0) return StreamScript{.steps = {testing::Hang<v1::TokenEvent>(&never)}};
    return Decodes(20, 3);
  });

  Result r = rig.Generate();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.Tokens(), (std::vector<int32_t>{20, 21, 22}));
  const std::vector<FakeNodes::Record> prefills = rig.nodes.prefills();
  ASSERT_EQ(prefills.size(), 2u);
  EXPECT_EQ(prefills[0].address, "p0");
  EXPECT_EQ(prefills[1].address, "p1");
  EXPECT_EQ(rig.nodes.releases(), (std::vector<std::string>{"d0"}));  // attempt 1's blocks
  EXPECT_EQ(r.responses.back().timings().prefill_attempts(), 2);
  ExpectEverythingEnded(rig);
}

// D cannot reach the chosen P (ErrorReason kSenderUnreachable on an UNAVAILABLE Reserve): the
// pair is unusable, not D. P is excluded, D is not made suspect, and the request goes to the
// other P on the same D.
TEST(RequestDriverTest, ReserveRefusingTheSenderAsUnreachableExcludesThatPrefillNode) {
  TrackerOptions options;
  options.queue_timeout = absl::Seconds(1);  // were D made suspect, no pair would be left
  Rig rig(options);
  rig.AddNode("p0", NodeKind::kPrefill);
  rig.AddNode("p1", NodeKind::kPrefill, /*queued_tokens=*/1000);
  rig.AddNode("d0", NodeKind::kDecode);
  rig.nodes.SetReserve(
      "d0", [](const v1::ReserveRequest& req) -> absl::StatusOr<v1::ReserveResponse> {
        if (req.sender_node_id() == "p0") {
          return WithReason(absl::UnavailableError("Reserve on d0@1: connecting to p0 timed out"),
                            ErrorReason::kSenderUnreachable);
        }
        v1::ReserveResponse ok;
        ok.mutable_destination()->add_block_ids(7);
        ok.mutable_destination()->add_block_ids(8);
        return ok;
      });
  rig.nodes.SetPrefill("p0", Answers(30));
  rig.nodes.SetPrefill("p1", Answers(40));
  rig.nodes.SetStream("d0", [](int) { return Decodes(40, 2); });

  Result r = rig.Generate();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.Tokens(), (std::vector<int32_t>{40, 41}));
  const std::vector<v1::ReserveRequest> reserves = rig.nodes.reserve_requests();
  ASSERT_EQ(reserves.size(), 2u);
  EXPECT_EQ(reserves[0].sender_node_id(), "p0");
  EXPECT_EQ(reserves[1].sender_node_id(), "p1");
  ASSERT_EQ(rig.nodes.prefills().size(), 1u);  // p0 was never asked to prefill
  EXPECT_EQ(rig.nodes.prefills()[0].address, "p1");
  EXPECT_EQ(rig.nodes.releases(), (std::vector<std::string>{"d0"}));  // what D may hold
  ExpectEverythingEnded(rig);
}

// P hangs past its phase deadline: the tracker retries on the other P, and the driver abandons
// the first attempt at once: both its calls are cancelled and its reader threads joined before
// the next attempt reserves (the fake's calls take a while to unwind once cancelled).
TEST(RequestDriverTest, ReRouteJoinsTheAbandonedAttemptsThreadsBeforeTheNextAttempt) {
  TrackerOptions options;
  options.prefill_timeout = absl::Milliseconds(300);
  Rig rig(options);
  rig.AddNode("p0", NodeKind::kPrefill);
  rig.AddNode("p1", NodeKind::kPrefill, /*queued_tokens=*/1000);
  rig.AddNode("d0", NodeKind::kDecode);
  absl::Notification never;
  rig.nodes.SetPrefill("p0", Hangs(&never));
  rig.nodes.SetPrefill("p1", Answers(50));
  rig.nodes.SetStream("d0", [&](int call) {
    if (call == 0) return StreamScript{.steps = {testing::Hang<v1::TokenEvent>(&never)}};
    return Decodes(50, 3);
  });

  Result r = rig.Generate();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.Tokens(), (std::vector<int32_t>{50, 51, 52}));
  const std::vector<FakeNodes::Record> reserves = rig.nodes.reserves();
  ASSERT_EQ(reserves.size(), 2u);
  EXPECT_EQ(reserves[1].active_calls, 0) << "attempt 1's calls still ran when attempt 2 began";
  const std::vector<FakeNodes::Record> prefills = rig.nodes.prefills();
  ASSERT_EQ(prefills.size(), 2u);
  EXPECT_EQ(prefills[1].address, "p1");
  EXPECT_EQ(rig.nodes.prefill_cancels(), (std::vector<std::string>{"p0"}));
  EXPECT_EQ(r.responses.back().timings().prefill_attempts(), 2);
  ExpectEverythingEnded(rig);
}

// The last prefill attempt times out: the request ends with the tracker's deadline error at
// once, its calls cancelled and joined, D's reservation released and P told to cancel.
TEST(RequestDriverTest, PhaseDeadlineEndsTheRequestWithItsError) {
  TrackerOptions options;
  options.prefill_timeout = absl::Milliseconds(200);
  options.max_prefill_attempts = 1;
  Rig rig(options);
  rig.AddNode("p0", NodeKind::kPrefill);
  rig.AddNode("d0", NodeKind::kDecode);
  absl::Notification never;
  rig.nodes.SetPrefill("p0", Hangs(&never));
  rig.nodes.SetStream(
      "d0", [&](int) { return StreamScript{.steps = {testing::Hang<v1::TokenEvent>(&never)}}; });

  const absl::Time start = absl::Now();
  Result r = rig.Generate(absl::Seconds(5));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded) << r.status;
  EXPECT_NE(r.status.message().find("prefill phase exceeded"), absl::string_view::npos) << r.status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_TRUE(r.responses.empty());
  EXPECT_EQ(rig.nodes.releases(), (std::vector<std::string>{"d0"}));
  EXPECT_EQ(rig.nodes.prefill_cancels(), (std::vector<std::string>{"p0"}));
  ExpectEverythingEnded(rig);
}

// D preempts the request after two tokens: it is resumed (here on the same D, which has room
// again) from the prompt and the tokens sent, P sampling step 2; the client sees each token once.
TEST(RequestDriverTest, PreemptedRequestResumesFromTheTokensAlreadySent) {
  Rig rig(TrackerOptions{});
  rig.AddNode("p0", NodeKind::kPrefill);
  rig.AddNode("d0", NodeKind::kDecode);
  rig.nodes.SetPrefill("p0", [](int call, const v1::PrefillRequest&) {
    return PrefillScript{.steps = {Scheduled(), FirstToken(call == 0 ? 60 : 62), Landed()}};
  });
  // D gives it back once the client has both tokens (P's, then D's).
  absl::Notification two_sent;
  rig.on_write = [&](const v1::GenerateResponse& r) {
    if (r.index() == 1) two_sent.Notify();
  };
  rig.nodes.SetStream("d0", [&](int call) {
    if (call == 0) {
      testing::Step<v1::TokenEvent> preempt = Token(0, 2, v1::FINISH_REASON_PREEMPTED);
      preempt.after = &two_sent;
      return StreamScript{.steps = {Admitted(), Token(61, 1), preempt}};
    }
    return StreamScript{.steps = {Admitted(), Token(63, 3, v1::FINISH_REASON_MAX_TOKENS)}};
  });

  Result r = rig.Generate();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.Tokens(), (std::vector<int32_t>{60, 61, 62, 63}));
  const std::vector<v1::PrefillRequest> prefills = rig.nodes.prefill_requests();
  ASSERT_EQ(prefills.size(), 2u);
  EXPECT_EQ(prefills[1].sample_step(), 2);
  ASSERT_EQ(prefills[1].prompt_token_ids_size(), kPromptTokens + 2);
  EXPECT_EQ(prefills[1].prompt_token_ids(kPromptTokens), 60);
  EXPECT_EQ(prefills[1].prompt_token_ids(kPromptTokens + 1), 61);
  EXPECT_EQ(rig.nodes.reserve_requests()[1].generated_tokens(), 2);
  EXPECT_EQ(r.responses.back().timings().resumes(), 1);
  // Running, waiting again while it is resumed, running once the resume's prefill is scheduled.
  EXPECT_EQ(r.scheduled, (std::vector<bool>{true, false, true}));
  ExpectEverythingEnded(rig);
}

}  // namespace
}  // namespace duet::coordinator
