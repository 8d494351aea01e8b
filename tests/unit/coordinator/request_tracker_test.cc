#include "coordinator/request_tracker.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace duet::coordinator {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(2'000'000);
const NodeIncarnation kD{"d0", 1};
const NodeIncarnation kP0{"p0", 1};
const NodeIncarnation kP1{"p1", 1};

TrackerOptions Opts() {
  return TrackerOptions{.queue_timeout = absl::Seconds(3),
                        .reserve_timeout = absl::Seconds(1),
                        .reserve_grace = absl::Seconds(1),
                        .prefill_timeout = absl::Seconds(10),
                        .transfer_timeout = absl::Seconds(2),
                        .decode_stall_timeout = absl::Seconds(5),
                        .max_prefill_attempts = 2,
                        .max_resumes = 2};
}

bool Contains(absl::string_view haystack, const std::string& needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

class RequestTrackerTest : public ::testing::Test {
 protected:
  RequestTrackerTest() : tracker_(Opts(), &dir_) {}

  // Start "r1", reserve blocks on kD and start prefill on `p`.
  void ToPrefill(const NodeIncarnation& p = kP0, absl::Time now = kT0) {
    ASSERT_TRUE(tracker_.Start("r1", now).ok());
    Effects fx = tracker_.OnReserved("r1", kD, {1, 2, 3}, now);
    ASSERT_TRUE(fx.empty());
    ASSERT_TRUE(tracker_.OnPrefillStarted("r1", p, now).ok());
  }
  void ToDecode(absl::Time now = kT0) {
    ToPrefill(kP0, now);
    ASSERT_TRUE(tracker_.OnFirstToken("r1", kP0, now).ok());
    ASSERT_TRUE(tracker_.OnAdmitted("r1", kD, now).ok());
  }
  // After a resume: reserved on kD again, prefilled on kP1, admitted.
  void ToDecodeAgain(absl::Time now = kT0) {
    ASSERT_TRUE(tracker_.OnReserved("r1", kD, {4, 5}, now).empty());
    ASSERT_TRUE(tracker_.OnPrefillStarted("r1", kP1, now).ok());
    ASSERT_TRUE(tracker_.OnFirstToken("r1", kP1, now).ok());
    ASSERT_TRUE(tracker_.OnAdmitted("r1", kD, now).ok());
  }
  void ExpectGone(const RequestId& r) {
    EXPECT_FALSE(tracker_.Find(r).has_value());
    EXPECT_EQ(dir_.StateOf(r), KvState::kAbsent);
    EXPECT_TRUE(dir_.CheckConsistency().ok());
  }

  CacheDirectory dir_;
  RequestTracker tracker_;
};

TEST_F(RequestTrackerTest, HappyPathWalksThePhasesAndTheDirectory) {
  ASSERT_TRUE(tracker_.Start("r1", kT0).ok());
  EXPECT_EQ(tracker_.Start("r1", kT0).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(tracker_.Find("r1")->phase, Phase::kReserve);
  // Waiting for room (3 s) and the Reserve RPC (1 s), with a margin (1 s) over the RPC.
  EXPECT_EQ(tracker_.Find("r1")->deadline, kT0 + absl::Seconds(5));
  EXPECT_TRUE(tracker_.OnReserved("r1", kD, {1, 2}, kT0).empty());
  EXPECT_EQ(dir_.StateOf("r1"), KvState::kReserved);

  ASSERT_TRUE(tracker_.OnPrefillStarted("r1", kP0, kT0 + absl::Milliseconds(1)).ok());
  EXPECT_EQ(tracker_.Find("r1")->phase, Phase::kPrefill);
  EXPECT_EQ(dir_.StateOf("r1"), KvState::kWriting);
  EXPECT_EQ(tracker_.NextDeadline(), kT0 + absl::Milliseconds(1) + absl::Seconds(10));

  ASSERT_TRUE(tracker_.OnFirstToken("r1", kP0, kT0 + absl::Seconds(1)).ok());
  EXPECT_EQ(tracker_.Find("r1")->phase, Phase::kTransfer);
  EXPECT_EQ(dir_.StateOf("r1"), KvState::kWriting);

  ASSERT_TRUE(tracker_.OnAdmitted("r1", kD, kT0 + absl::Seconds(2)).ok());
  EXPECT_EQ(tracker_.Find("r1")->phase, Phase::kDecode);
  EXPECT_EQ(dir_.StateOf("r1"), KvState::kOwned);
  ASSERT_TRUE(tracker_.OnToken("r1", kT0 + absl::Seconds(3)).ok());

  auto fx = tracker_.OnFinished("r1", kT0 + absl::Seconds(4));
  ASSERT_TRUE(fx.ok()) << fx.status();
  ASSERT_EQ(fx->finished.size(), 1u);
  EXPECT_TRUE(fx->finished[0].status.ok());
  EXPECT_TRUE(fx->releases.empty());  // D freed the blocks itself
  EXPECT_TRUE(fx->prefill_cancels.empty());
  ExpectGone("r1");
  EXPECT_EQ(tracker_.size(), 0u);
}

TEST_F(RequestTrackerTest, AdmissionMayOvertakeTheFirstToken) {
  ToPrefill();
  ASSERT_TRUE(tracker_.OnAdmitted("r1", kD, kT0).ok());
  EXPECT_EQ(tracker_.Find("r1")->phase, Phase::kDecode);
  EXPECT_TRUE(tracker_.OnFirstToken("r1", kP0, kT0).ok());
  EXPECT_TRUE(tracker_.Find("r1")->first_token);
  EXPECT_EQ(tracker_.Find("r1")->phase, Phase::kDecode);
}

TEST_F(RequestTrackerTest, EventsOutOfPhaseOrFromTheWrongNodeChangeNothing) {
  ToPrefill();
  EXPECT_EQ(tracker_.OnToken("r1", kT0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tracker_.OnFinished("r1", kT0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tracker_.OnFirstToken("r1", kP1, kT0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tracker_.OnAdmitted("r1", {"d0", 2}, kT0).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tracker_.OnPrefillFailed("r1", kP1, absl::InternalError("x"), kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tracker_.OnDecodeFailed("r1", {"d9", 1}, absl::InternalError("x"), kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tracker_.Find("r1")->phase, Phase::kPrefill);
  EXPECT_EQ(dir_.StateOf("r1"), KvState::kWriting);
  EXPECT_EQ(tracker_.OnToken("nope", kT0).code(), absl::StatusCode::kNotFound);
}

TEST_F(RequestTrackerTest, PrefillFailureIsRetriedOnceOnAnotherNodeThenEnds) {
  ToPrefill(kP0);
  auto fx = tracker_.OnPrefillFailed("r1", kP0, absl::UnavailableError("socket closed"),
                                     kT0 + absl::Seconds(1));
  ASSERT_TRUE(fx.ok()) << fx.status();
  EXPECT_EQ(fx->releases, (std::vector<Effects::Release>{{"r1", kD}}));
  EXPECT_EQ(fx->retries, (std::vector<RequestId>{"r1"}));
  EXPECT_TRUE(fx->finished.empty());
  auto r = tracker_.Find("r1");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->phase, Phase::kReserve);
  EXPECT_FALSE(r->decode.has_value());
  EXPECT_EQ(r->failed_prefill, (std::vector<NodeId>{"p0"}));
  EXPECT_EQ(r->deadline, kT0 + absl::Seconds(6));  // a fresh reserve deadline
  EXPECT_EQ(dir_.StateOf("r1"), KvState::kAbsent);

  // Re-route: a new reservation; the failed prefill node is refused, another one accepted.
  EXPECT_TRUE(tracker_.OnReserved("r1", kD, {7, 8}, kT0 + absl::Seconds(1)).empty());
  EXPECT_EQ(tracker_.OnPrefillStarted("r1", kP0, kT0).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(tracker_.OnPrefillStarted("r1", kP1, kT0 + absl::Seconds(1)).ok());
  EXPECT_EQ(tracker_.Find("r1")->prefill_attempts, 2);
  // A late answer from the first prefill node is ignored.
  EXPECT_EQ(tracker_.OnFirstToken("r1", kP0, kT0).code(), absl::StatusCode::kFailedPrecondition);

  fx = tracker_.OnPrefillFailed("r1", kP1, absl::InternalError("out of memory"),
                                kT0 + absl::Seconds(2));
  ASSERT_TRUE(fx.ok()) << fx.status();
  EXPECT_TRUE(fx->retries.empty());
  EXPECT_EQ(fx->releases, (std::vector<Effects::Release>{{"r1", kD}}));
  ASSERT_EQ(fx->finished.size(), 1u);
  const absl::Status& st = fx->finished[0].status;
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(st.message(), "p0@1: socket closed")) << st;
  EXPECT_TRUE(Contains(st.message(), "p1@1: out of memory")) << st;
  ExpectGone("r1");
}

TEST_F(RequestTrackerTest, NoRetryWhenOneAttemptIsAllowed) {
  TrackerOptions o = Opts();
  o.max_prefill_attempts = 1;
  CacheDirectory dir;
  RequestTracker tracker(o, &dir);
  ASSERT_TRUE(tracker.Start("r1", kT0).ok());
  tracker.OnReserved("r1", kD, {1}, kT0);
  ASSERT_TRUE(tracker.OnPrefillStarted("r1", kP0, kT0).ok());
  auto fx = tracker.OnPrefillFailed("r1", kP0, absl::UnavailableError("gone"), kT0);
  ASSERT_TRUE(fx.ok());
  EXPECT_TRUE(fx->retries.empty());
  ASSERT_EQ(fx->finished.size(), 1u);
  EXPECT_FALSE(fx->finished[0].status.ok());
  EXPECT_TRUE(dir.empty());
}

TEST_F(RequestTrackerTest, DecodeFailureEndsTheRequestNamingTheNode) {
  ToPrefill();
  auto fx = tracker_.OnDecodeFailed("r1", kD, absl::UnavailableError("stream reset"), kT0);
  ASSERT_TRUE(fx.ok()) << fx.status();
  ASSERT_EQ(fx->finished.size(), 1u);
  EXPECT_EQ(fx->finished[0].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(fx->finished[0].status.message(), "decode node d0@1"))
      << fx->finished[0].status;
  EXPECT_TRUE(Contains(fx->finished[0].status.message(), "stream reset"));
  EXPECT_TRUE(fx->retries.empty());
  EXPECT_EQ(fx->releases, (std::vector<Effects::Release>{{"r1", kD}}));
  // P was still writing into D: stop it.
  EXPECT_EQ(fx->prefill_cancels, (std::vector<Effects::CancelPrefill>{{"r1", kP0}}));
  ExpectGone("r1");
}

TEST_F(RequestTrackerTest, CancelReleasesEverythingInEveryPhase) {
  // kReserve before the reservation answer arrives: nothing to release yet...
  ASSERT_TRUE(tracker_.Start("r1", kT0).ok());
  auto fx = tracker_.Cancel("r1", kT0);
  ASSERT_TRUE(fx.ok());
  EXPECT_TRUE(fx->releases.empty());
  ASSERT_EQ(fx->finished.size(), 1u);
  EXPECT_EQ(fx->finished[0].status.code(), absl::StatusCode::kCancelled);
  // ...and when it does arrive, it is released rather than leaked.
  Effects late = tracker_.OnReserved("r1", kD, {1, 2}, kT0);
  EXPECT_EQ(late.releases, (std::vector<Effects::Release>{{"r1", kD}}));
  ExpectGone("r1");
  EXPECT_EQ(tracker_.Cancel("r1", kT0).status().code(), absl::StatusCode::kNotFound);

  // kPrefill: release on D and cancel on P.
  ToPrefill();
  fx = tracker_.Cancel("r1", kT0);
  ASSERT_TRUE(fx.ok());
  EXPECT_EQ(fx->releases, (std::vector<Effects::Release>{{"r1", kD}}));
  EXPECT_EQ(fx->prefill_cancels, (std::vector<Effects::CancelPrefill>{{"r1", kP0}}));
  ExpectGone("r1");

  // kDecode: release on D only.
  ToDecode();
  fx = tracker_.Cancel("r1", kT0);
  ASSERT_TRUE(fx.ok());
  EXPECT_EQ(fx->releases, (std::vector<Effects::Release>{{"r1", kD}}));
  EXPECT_TRUE(fx->prefill_cancels.empty());
  ExpectGone("r1");
}

TEST_F(RequestTrackerTest, DuplicateOrOrphanReservationsAreHandled) {
  ASSERT_TRUE(tracker_.Start("r1", kT0).ok());
  EXPECT_TRUE(tracker_.OnReserved("r1", kD, {1}, kT0).empty());
  EXPECT_TRUE(tracker_.OnReserved("r1", kD, {1}, kT0).empty());    // duplicate: no-op
  Effects other = tracker_.OnReserved("r1", {"d1", 1}, {1}, kT0);  // a second one: released
  EXPECT_EQ(other.releases, (std::vector<Effects::Release>{{"r1", {"d1", 1}}}));
  EXPECT_EQ(dir_.Find("r1")->decode, kD);
  // A reservation the directory refuses (block already held) ends the request and is released.
  ASSERT_TRUE(tracker_.Start("r2", kT0).ok());
  Effects clash = tracker_.OnReserved("r2", kD, {1}, kT0);
  EXPECT_EQ(clash.releases, (std::vector<Effects::Release>{{"r2", kD}}));
  ASSERT_EQ(clash.finished.size(), 1u);
  EXPECT_EQ(clash.finished[0].status.code(), absl::StatusCode::kAlreadyExists);
  ExpectGone("r2");
}

TEST_F(RequestTrackerTest, ReserveDeadline) {
  ASSERT_TRUE(tracker_.Start("r1", kT0).ok());
  tracker_.OnReserved("r1", kD, {1}, kT0);
  // Never while the caller may still be within its queue wait and Reserve RPC.
  EXPECT_TRUE(tracker_.ExpireDeadlines(kT0 + absl::Seconds(4)).empty());
  EXPECT_TRUE(tracker_.ExpireDeadlines(kT0 + absl::Seconds(5) - absl::Nanoseconds(1)).empty());
  Effects fx = tracker_.ExpireDeadlines(kT0 + absl::Seconds(5));
  ASSERT_EQ(fx.finished.size(), 1u);
  EXPECT_EQ(fx.finished[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(fx.finished[0].status.message(), "reserve phase")) << fx.finished[0].status;
  EXPECT_EQ(fx.releases, (std::vector<Effects::Release>{{"r1", kD}}));
  ExpectGone("r1");
}

TEST_F(RequestTrackerTest, PrefillAndTransferDeadlinesCountAsPrefillFailures) {
  ToPrefill(kP0);
  EXPECT_TRUE(tracker_.ExpireDeadlines(kT0 + absl::Seconds(9)).empty());
  Effects fx = tracker_.ExpireDeadlines(kT0 + absl::Seconds(10));
  EXPECT_EQ(fx.retries, (std::vector<RequestId>{"r1"}));
  EXPECT_EQ(fx.prefill_cancels, (std::vector<Effects::CancelPrefill>{{"r1", kP0}}));
  EXPECT_EQ(fx.releases, (std::vector<Effects::Release>{{"r1", kD}}));
  // Second attempt times out in the transfer phase: the request ends, DEADLINE_EXCEEDED.
  const absl::Time t1 = kT0 + absl::Seconds(10);
  tracker_.OnReserved("r1", kD, {5}, t1);
  ASSERT_TRUE(tracker_.OnPrefillStarted("r1", kP1, t1).ok());
  ASSERT_TRUE(tracker_.OnFirstToken("r1", kP1, t1 + absl::Seconds(1)).ok());
  EXPECT_TRUE(tracker_.ExpireDeadlines(t1 + absl::Seconds(2)).empty());
  fx = tracker_.ExpireDeadlines(t1 + absl::Seconds(3));
  ASSERT_EQ(fx.finished.size(), 1u);
  EXPECT_EQ(fx.finished[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(fx.finished[0].status.message(), "transfer phase")) << fx.finished[0].status;
  EXPECT_EQ(fx.prefill_cancels, (std::vector<Effects::CancelPrefill>{{"r1", kP1}}));
  ExpectGone("r1");
}

TEST_F(RequestTrackerTest, DecodeStallDeadlineIsReArmedByTokens) {
  ToDecode(kT0);
  ASSERT_TRUE(tracker_.OnToken("r1", kT0 + absl::Seconds(4)).ok());
  EXPECT_TRUE(tracker_.ExpireDeadlines(kT0 + absl::Seconds(8)).empty());
  Effects fx = tracker_.ExpireDeadlines(kT0 + absl::Seconds(9));
  ASSERT_EQ(fx.finished.size(), 1u);
  EXPECT_EQ(fx.finished[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(fx.finished[0].status.message(), "decode phase")) << fx.finished[0].status;
  EXPECT_TRUE(Contains(fx.finished[0].status.message(), "on d0@1")) << fx.finished[0].status;
  EXPECT_EQ(fx.releases, (std::vector<Effects::Release>{{"r1", kD}}));
  ExpectGone("r1");
}

TEST_F(RequestTrackerTest, DeadDecodeNodeResumesItsRequestsAndDeadPrefillNodeRetries) {
  // r1 prefills on p0 into d0; r2 decodes on d1 after prefill on p0; r3 prefills on p1 into d1.
  const NodeIncarnation d1{"d1", 1};
  ToPrefill(kP0);
  ASSERT_TRUE(tracker_.Start("r2", kT0).ok());
  tracker_.OnReserved("r2", d1, {1}, kT0);
  ASSERT_TRUE(tracker_.OnPrefillStarted("r2", kP0, kT0).ok());
  ASSERT_TRUE(tracker_.OnAdmitted("r2", d1, kT0).ok());
  ASSERT_TRUE(tracker_.Start("r3", kT0).ok());
  tracker_.OnReserved("r3", d1, {2}, kT0);
  ASSERT_TRUE(tracker_.OnPrefillStarted("r3", kP1, kT0).ok());

  // p0 dies: only r1 (still prefilling on it) is retried; r2 is past prefill.
  Effects fx = tracker_.OnNodeDead(kP0, kT0);
  EXPECT_EQ(fx.retries, (std::vector<RequestId>{"r1"}));
  EXPECT_EQ(fx.releases, (std::vector<Effects::Release>{{"r1", kD}}));
  EXPECT_TRUE(fx.prefill_cancels.empty());  // nobody to cancel on a dead node
  EXPECT_TRUE(fx.finished.empty());

  // d1 dies: r2 and r3 go back to be resumed elsewhere (d1 excluded), no Release sent to the
  // dead node, and r3's prefill on p1 (writing into d1) is cancelled without counting against p1.
  fx = tracker_.OnNodeDead(d1, kT0);
  EXPECT_TRUE(fx.finished.empty());
  EXPECT_EQ(fx.retries, (std::vector<RequestId>{"r2", "r3"}));
  EXPECT_TRUE(fx.releases.empty());
  EXPECT_EQ(fx.prefill_cancels, (std::vector<Effects::CancelPrefill>{{"r3", kP1}}));
  for (const char* id : {"r2", "r3"}) {
    std::optional<TrackedRequest> t = tracker_.Find(id);
    ASSERT_TRUE(t.has_value()) << id;
    EXPECT_EQ(t->phase, Phase::kReserve) << id;
    EXPECT_EQ(t->failed_decode, (std::vector<NodeId>{"d1"})) << id;
    EXPECT_EQ(t->resumes, 1) << id;
    EXPECT_TRUE(t->failed_prefill.empty()) << id;
    EXPECT_EQ(dir_.StateOf(id), KvState::kAbsent) << id;
  }
  EXPECT_EQ(tracker_.Find("r3")->prefill_failures, 0);
  EXPECT_EQ(dir_.Usage(d1), NodeUsage{});
  EXPECT_EQ(tracker_.size(), 3u);
}

// A decode node that preempts a request gave its blocks back (no Release); the request is
// resumed, on any node (none excluded), up to max_resumes times; then it ends naming each cause.
TEST_F(RequestTrackerTest, PreemptedRequestIsResumedUpToMaxResumes) {
  ToDecode(kT0);
  for (int i = 1; i <= 3; ++i) {
    absl::StatusOr<Effects> fx =
        tracker_.OnDecodeLost("r1", kD, absl::ResourceExhaustedError(absl::StrCat("pool full ", i)),
                              /*decode_gone=*/true, /*exclude=*/false, kT0);
    ASSERT_TRUE(fx.ok()) << fx.status();
    EXPECT_TRUE(fx->releases.empty());
    if (i <= 2) {
      EXPECT_EQ(fx->retries, (std::vector<RequestId>{"r1"}));
      EXPECT_TRUE(fx->finished.empty());
      EXPECT_TRUE(tracker_.Find("r1")->failed_decode.empty());
      EXPECT_EQ(dir_.StateOf("r1"), KvState::kAbsent);
      ToDecodeAgain();
      continue;
    }
    ASSERT_EQ(fx->finished.size(), 1u);
    const absl::Status& s = fx->finished[0].status;
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(Contains(s.message(), "max_resumes")) << s;
    for (const char* cause : {"pool full 1", "pool full 2", "pool full 3"}) {
      EXPECT_TRUE(Contains(s.message(), cause)) << s;
    }
    ExpectGone("r1");
  }
  // A stale report from a node that no longer holds the request changes nothing.
  ToDecode(kT0);
  absl::StatusOr<Effects> stale = tracker_.OnDecodeLost(
      "r1", NodeIncarnation{"d9", 1}, absl::UnavailableError("x"), true, true, kT0);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
}

// A prefill node that never answered is excluded, but its attempt does not use up the retry.
TEST_F(RequestTrackerTest, UnreachedPrefillNodeIsExcludedWithoutUsingAnAttempt) {
  ToPrefill(kP0);
  absl::StatusOr<Effects> fx =
      tracker_.OnPrefillFailed("r1", kP0, absl::UnavailableError("connection refused"), kT0,
                               /*unreached=*/true);
  ASSERT_TRUE(fx.ok());
  EXPECT_EQ(fx->retries, (std::vector<RequestId>{"r1"}));
  EXPECT_EQ(tracker_.Find("r1")->failed_prefill, (std::vector<NodeId>{"p0"}));
  // The retry on p1 fails for real: one more attempt is still allowed.
  tracker_.OnReserved("r1", kD, {7}, kT0);
  ASSERT_TRUE(tracker_.OnPrefillStarted("r1", kP1, kT0).ok());
  fx = tracker_.OnPrefillFailed("r1", kP1, absl::InternalError("boom"), kT0);
  ASSERT_TRUE(fx.ok());
  EXPECT_EQ(fx->retries, (std::vector<RequestId>{"r1"}));
  EXPECT_TRUE(fx->finished.empty());
}

// D fenced the prefill node while it waited for the KV (in either prefill phase): the request
// is released on D, the prefill node is told to cancel and excluded, and the request is retried
// without using up an attempt, even where only one is allowed. The cause is kept for the
// refusal that lists the attempts.
TEST_F(RequestTrackerTest, SenderFencedDuringTheTransferIsExcludedWithoutUsingAnAttempt) {
  TrackerOptions o = Opts();
  o.max_prefill_attempts = 1;
  CacheDirectory dir;
  RequestTracker tracker(o, &dir);
  ASSERT_TRUE(tracker.Start("r1", kT0).ok());
  EXPECT_TRUE(tracker.OnReserved("r1", kD, {1, 2}, kT0).empty());
  ASSERT_TRUE(tracker.OnPrefillStarted("r1", kP0, kT0).ok());
  ASSERT_TRUE(tracker.OnFirstToken("r1", kP0, kT0).ok());  // kTransfer
  // A stale report (another prefill node) changes nothing.
  EXPECT_EQ(tracker.OnSenderFenced("r1", kP1, absl::UnavailableError("x"), kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<Effects> fx = tracker.OnSenderFenced(
      "r1", kP0, absl::UnavailableError("d0@1 fenced it while waiting for the KV"), kT0);
  ASSERT_TRUE(fx.ok()) << fx.status();
  EXPECT_EQ(fx->releases, (std::vector<Effects::Release>{{"r1", kD}}));
  EXPECT_EQ(fx->prefill_cancels, (std::vector<Effects::CancelPrefill>{{"r1", kP0}}));
  EXPECT_EQ(fx->retries, (std::vector<RequestId>{"r1"}));
  EXPECT_TRUE(fx->finished.empty());
  std::optional<TrackedRequest> r = tracker.Find("r1");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->phase, Phase::kReserve);
  EXPECT_EQ(r->prefill_failures, 0);
  EXPECT_EQ(r->failed_prefill, (std::vector<NodeId>{"p0"}));
  ASSERT_EQ(r->prefill_errors.size(), 1u);
  EXPECT_TRUE(Contains(r->prefill_errors[0], "p0@1: d0@1 fenced it")) << r->prefill_errors[0];
  EXPECT_EQ(dir.StateOf("r1"), KvState::kAbsent);
  // Once admitted, there is no transfer left to fence.
  tracker.OnReserved("r1", kD, {3}, kT0);
  ASSERT_TRUE(tracker.OnPrefillStarted("r1", kP1, kT0).ok());
  ASSERT_TRUE(tracker.OnAdmitted("r1", kD, kT0).ok());
  EXPECT_EQ(tracker.OnSenderFenced("r1", kP1, absl::UnavailableError("x"), kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Prefills of resumed attempts are not failures: a request resumed after its first prefill
// still has its retry when a later prefill node fails.
TEST_F(RequestTrackerTest, ResumesDoNotUseUpThePrefillRetry) {
  ToDecode(kT0);  // prefilled once on p0
  ASSERT_TRUE(tracker_
                  .OnDecodeLost("r1", kD, absl::ResourceExhaustedError("full"),
                                /*decode_gone=*/true, /*exclude=*/false, kT0)
                  .ok());
  tracker_.OnReserved("r1", kD, {3}, kT0);
  ASSERT_TRUE(tracker_.OnPrefillStarted("r1", kP1, kT0).ok());  // the resume's prefill
  absl::StatusOr<Effects> fx =
      tracker_.OnPrefillFailed("r1", kP1, absl::InternalError("boom"), kT0);
  ASSERT_TRUE(fx.ok());
  EXPECT_EQ(fx->retries, (std::vector<RequestId>{"r1"})) << "the retry was used up";
  EXPECT_TRUE(fx->finished.empty());
}

}  // namespace
}  // namespace duet::coordinator
