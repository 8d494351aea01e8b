// PrefillScheduler has one owner per request, its scheduler thread: the caller submits and reads
// an event stream, nothing more. A cancelled request's stream is aborted and its blocks freed by
// the scheduler before its stream reports the end, and the abort's wait for writes that never
// end does not hold the scheduler thread; a caller that never reads its stream holds nothing
// back.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "prefill_node/prefill_scheduler.h"
#include "tests/unit/prefill_node/prefill_scheduler_rig.h"

namespace duet::prefill {
namespace {

class PrefillSchedulerOwnerTest : public PrefillSchedulerTest {};

TEST_F(PrefillSchedulerOwnerTest, CancelledRequestsBlocksAreFreeBeforeItsStreamEnds) {
  constexpr absl::Duration kAbortTimeout = absl::Seconds(1);
  Rig r({.abort_timeout = kAbortTimeout});
  Reference ref = Reference::Load(16);
  r.black_hole->store(true);  // "held"'s writes neither land nor end
  absl::StatusOr<std::shared_ptr<PrefillStream>> held =
      r.sched->Submit(r.Job("held", 1, Prompt(40, 1, r.vocab())));
  ASSERT_TRUE(held.ok()) << held.status();
  std::vector<PrefillEvent> events = (*held)->Pop(DeadlineIn(absl::Seconds(10)));
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].kind, PrefillEventKind::kScheduled);
  events.erase(events.begin());
  if (events.empty()) events = (*held)->Pop(DeadlineIn(absl::Seconds(10)));
  ASSERT_EQ(events.size(), 1u);
  ASSERT_EQ(events[0].kind, PrefillEventKind::kFirstToken);  // its KV is "landing"
  EXPECT_GT(r.ppool->Stats().used, 0);

  ASSERT_TRUE(r.sched->Cancel("held"));
  const absl::Time cancelled = absl::Now();
  r.black_hole->store(false);  // later writes land (the held ones stay held)
  // Aborting "held" waits abort_timeout for its writes, then closes their endpoint; meanwhile
  // the scheduler thread serves the next request.
  const std::vector<int32_t> prompt = Prompt(20, 2, r.vocab());
  absl::StatusOr<PrefillResult> next = r.Run(r.Job("next", 2, prompt));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->first_token.id, ref.FirstToken(prompt));
  EXPECT_FALSE((*held)->finished())
      << "\"held\" ended before \"next\" landed: its end did not wait for its abort, or the "
         "abort held the scheduler thread";

  // The end comes once the stream was aborted and every block is back.
  events = (*held)->Pop(DeadlineIn(absl::Seconds(10)));
  const kv::BlockPoolStats at_end = r.ppool->Stats();
  const int64_t streaming_at_end = r.sender->active_requests();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, PrefillEventKind::kFailed);
  EXPECT_TRUE(absl::IsCancelled(events[0].status)) << events[0].status;
  EXPECT_EQ(at_end.available(), at_end.total)
      << "the stream ended before the blocks were free: " << at_end.used << " used";
  EXPECT_EQ(streaming_at_end, 0) << "the stream ended before its transfer was aborted";
  EXPECT_GE(absl::Now() - cancelled, kAbortTimeout - absl::Milliseconds(50));
  r.ExpectNoLeaks();
}

TEST_F(PrefillSchedulerOwnerTest, ACallerThatNeverReadsItsStreamHoldsNothingBack) {
  // The first pass waits until "unread" is cancelled: on a loaded machine both could otherwise
  // finish before the Cancel.
  Gate gate;
  PrefillSchedulerOptions opts;
  opts.on_batch = [&](const BatchInfo&) { gate.Block(); };
  Rig r(std::move(opts), /*p_blocks=*/4);  // one 60-token prompt at a time
  Reference ref = Reference::Load(16);
  const int vocab = r.vocab();
  // Streams nobody reads: one dropped at once, one cancelled.
  ASSERT_TRUE(r.sched->Submit(r.Job("dropped", 1, Prompt(60, 1, vocab))).ok());
  absl::StatusOr<std::shared_ptr<PrefillStream>> unread =
      r.sched->Submit(r.Job("unread", 2, Prompt(60, 2, vocab)));
  ASSERT_TRUE(unread.ok()) << unread.status();
  gate.AwaitReached();
  EXPECT_TRUE(r.sched->Cancel("unread"));
  gate.Open();
  // Each of these needs the whole pool: served only once the others gave their blocks back.
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t> prompt = Prompt(60, 10 + i, vocab);
    absl::StatusOr<PrefillResult> res =
        r.Run(r.Job("next-" + std::to_string(i), 10 + i, prompt, absl::Seconds(5)));
    ASSERT_TRUE(res.ok()) << i << ": " << res.status();
    EXPECT_EQ(res->first_token.id, ref.FirstToken(prompt)) << i;
  }
  EXPECT_TRUE((*unread)->finished());
  r.DrainD();
  ExpectCompleteStream(r.got[1], r.layout.num_layers);
  EXPECT_TRUE(r.got[2].HasAborted() || r.got[2].HasFinal());
  r.ExpectNoLeaks();
}

}  // namespace
}  // namespace duet::prefill
