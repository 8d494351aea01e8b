// The bound on quarantine (docs/design.md invariant 4): a quarantined request's sender is asked
// to confirm it is quiet; one that does not answer within the bound is fenced, and its blocks
// are released only where the fence revokes its writes (inproc as tcp), else reported overdue
// until it answers or is gone (inproc modelling shared memory). The fence lasts only until the
// sender confirms every transfer it was fenced for.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "common/base/clock.h"
#include "common/kv/block_pool.h"
#include "transfer/kv_stream/kv_arrival_tracker.h"
#include "transfer/kv_stream/kv_notice.h"
#include "transfer/kv_stream/kv_stream_sender.h"
#include "transfer/kv_stream/quiet_responder.h"
#include "transfer/transport.h"

namespace duet::transfer {
namespace {

constexpr int kLayers = 2;
constexpr int kBlocks = 16;
constexpr absl::Duration kBound = absl::Milliseconds(150);

kv::KvLayout Layout() {
  return kv::KvLayout{.model_id = "tiny",
                      .num_layers = kLayers,
                      .num_kv_heads = 1,
                      .head_dim = 4,
                      .block_size = 2,
                      .dtype = kv::KvDtype::kF32};
}

// P (sender) and D (receiver) over inproc; D's fence revokes P's writes unless `shm`.
class QuarantineBoundTest : public ::testing::TestWithParam<bool> {
 protected:
  bool shm() const { return GetParam(); }
  void SetUp() override {
    p_ = *CreateTransport(
        "inproc", {.name = "prefill", .layout = Layout(), .inproc_black_hole = black_hole_});
    d_ = *CreateTransport("inproc",
                          {.name = "decode", .layout = Layout(), .inproc_revocable = !shm()});
    p_region_ = *p_->AllocateRegion(Layout().RegionBytes(kBlocks));
    d_region_ = *d_->AllocateRegion(Layout().RegionBytes(kBlocks));
    p_pool_ = *kv::BlockPool::CreateOver(Layout(), kBlocks, p_region_->base(), p_region_->bytes());
    d_pool_ = *kv::BlockPool::CreateOver(Layout(), kBlocks, d_region_->base(), d_region_->bytes());
    to_d_ = *p_->Connect(*d_->LocalAddress(), DeadlineIn(absl::Seconds(1)));
    to_p_ = *d_->Connect(*p_->LocalAddress(), DeadlineIn(absl::Seconds(1)));
    sender_ = *KvStreamSender::Create(p_.get(), Layout(), kBlocks);
    tracker_ = std::make_unique<KvArrivalTracker>(
        d_.get(), d_pool_.get(),
        KvArrivalTrackerOptions{.quarantine_bound = kBound,
                                .fence_ask_interval = absl::Milliseconds(20)});
  }

  // Request `id`: expected by D, begun by P, layer 0 posted, then aborted by D (quarantined).
  std::vector<kv::BlockId> BeginAndAbort(uint64_t id, int n) {
    std::vector<kv::BlockId> local = *p_pool_->Allocate(n);
    std::vector<kv::BlockId> remote = *d_pool_->Allocate(n);
    EXPECT_TRUE(tracker_->Expect(id, to_p_, remote, DeadlineIn(absl::Seconds(30))).ok());
    EXPECT_TRUE(sender_->Begin({id, to_d_, local, remote}).ok());
    EXPECT_TRUE(sender_->OnLayerDone(0, {id}).ok());
    tracker_->Pump();
    EXPECT_TRUE(tracker_->Abort(id, "client went away").ok());
    EXPECT_EQ(tracker_->WaitReady(id, DeadlineIn(absl::Seconds(1))).status().code(),
              absl::StatusCode::kAborted);
    return local;
  }

  // Pumps D until `done` or `limit`; true if `done`.
  bool PumpUntil(const std::function<bool()>& done, absl::Duration limit) {
    const absl::Time deadline = DeadlineIn(limit);
    while (!done()) {
      if (absl::Now() >= deadline) return false;
      tracker_->Pump();
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

  // While true, P's writes neither land nor end (its link to D black-holed).
  std::shared_ptr<std::atomic<bool>> black_hole_ = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<Transport> p_, d_;
  std::unique_ptr<MemoryRegion> p_region_, d_region_;
  std::unique_ptr<kv::BlockPool> p_pool_, d_pool_;
  PeerId to_d_ = 0, to_p_ = 0;
  std::unique_ptr<KvStreamSender> sender_;
  std::unique_ptr<KvArrivalTracker> tracker_;
};

TEST_P(QuarantineBoundTest, SenderThatAnswersQuietReleasesWithinTheBound) {
  BeginAndAbort(1, 3);
  EXPECT_EQ(tracker_->quarantined_blocks(), 3);
  tracker_->Pump();  // asks P
  EXPECT_EQ(tracker_->quarantined_blocks(), 3);
  EXPECT_EQ(sender_->ServeQuietRequests(), 1);      // P stops request 1 and answers
  EXPECT_FALSE(sender_->OnLayerDone(1, {1}).ok());  // nothing more is posted for it
  tracker_->Pump();
  EXPECT_EQ(tracker_->quarantined_blocks(), 0);
  EXPECT_EQ(d_pool_->Stats().free, kBlocks);
  EXPECT_EQ(tracker_->fenced_senders(), 0);
  EXPECT_EQ(tracker_->quarantined_overdue_blocks(), 0);
}

TEST_P(QuarantineBoundTest, UnknownRequestIsAnsweredAndALaterBeginRefused) {
  // D timed out before P began (the Prefill call is late): P must not write after answering.
  std::vector<kv::BlockId> remote = *d_pool_->Allocate(2);
  ASSERT_TRUE(tracker_->Expect(2, to_p_, remote, DeadlineIn(absl::Milliseconds(10))).ok());
  absl::SleepFor(absl::Milliseconds(20));
  tracker_->Pump();  // deadline: quarantined, asked
  EXPECT_EQ(tracker_->quarantined_blocks(), 2);
  EXPECT_EQ(sender_->ServeQuietRequests(), 1);
  tracker_->Pump();
  EXPECT_EQ(tracker_->quarantined_blocks(), 0);
  std::vector<kv::BlockId> local = *p_pool_->Allocate(2);
  absl::Status begin = sender_->Begin({2, to_d_, local, remote});
  EXPECT_EQ(begin.code(), absl::StatusCode::kFailedPrecondition) << begin;
}

TEST_P(QuarantineBoundTest, QuietResponderThreadAnswers) {
  QuietResponder responder(p_.get(), sender_.get());
  BeginAndAbort(3, 2);
  EXPECT_TRUE(PumpUntil([&] { return tracker_->quarantined_blocks() == 0; }, kBound / 2));
  EXPECT_EQ(responder.answers_sent(), 1);
  EXPECT_EQ(tracker_->fenced_senders(), 0);
}

TEST_P(QuarantineBoundTest, SilentSenderIsFencedAfterTheBound) {
  std::vector<kv::BlockId> local = BeginAndAbort(4, 4);
  const absl::Time quarantined = absl::Now();
  tracker_->Pump();
  EXPECT_EQ(tracker_->quarantined_blocks(), 4);
  EXPECT_EQ(tracker_->quarantined_overdue_blocks(), 0);
  // P is alive and says nothing (stopped). Within the bound nothing changes.
  ASSERT_TRUE(PumpUntil([&] { return tracker_->fenced_senders() == 1; }, kBound * 4));
  EXPECT_GE(absl::Now() - quarantined, kBound);
  // While fenced, it gets no new transfer from this node, over any endpoint to it.
  {
    const PeerId fresh = *d_->Connect(*p_->LocalAddress(), DeadlineIn(absl::Seconds(1)));
    EXPECT_TRUE(tracker_->IsFenced(fresh));
    std::vector<kv::BlockId> remote = *d_pool_->Allocate(1);
    absl::Status refused = tracker_->Expect(5, fresh, remote, DeadlineIn(absl::Seconds(1)));
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
    EXPECT_NE(refused.message().find("fenced"), std::string::npos) << refused;
    ASSERT_TRUE(d_pool_->Free(remote).ok());
  }
  // A late write of the fenced sender (it wakes up and posts layer 1).
  const absl::Status late = sender_->OnLayerDone(1, {4});
  if (!shm()) {
    // tcp-like: the fence revoked P's writes, so the blocks are back at once.
    EXPECT_EQ(tracker_->quarantined_blocks(), 0);
    EXPECT_EQ(tracker_->quarantined_overdue_blocks(), 0);
    EXPECT_EQ(d_pool_->Stats().free, kBlocks);
    EXPECT_FALSE(late.ok());  // refused: it cannot land
  } else {
    // Shared memory: the write still lands, so the blocks stay quarantined and are overdue.
    EXPECT_TRUE(late.ok()) << late;
    tracker_->Pump();
    EXPECT_EQ(tracker_->quarantined_blocks(), 4);
    EXPECT_EQ(tracker_->quarantined_overdue_blocks(), 4);
    // Once it answers quiet they are released.
    EXPECT_EQ(sender_->ServeQuietRequests(), 1);
    tracker_->Pump();
    EXPECT_EQ(tracker_->quarantined_blocks(), 0);
    EXPECT_EQ(tracker_->quarantined_overdue_blocks(), 0);
    EXPECT_EQ(d_pool_->Stats().free, kBlocks);
  }
}

// The fence lifts once the sender confirms what it was fenced for (it was stopped, not dead),
// and its writes land again: the pair serves as before.
TEST_P(QuarantineBoundTest, FenceLiftsOnceTheSenderConfirmsAndThePairServesAgain) {
  BeginAndAbort(4, 4);
  ASSERT_TRUE(PumpUntil([&] { return tracker_->fenced_senders() == 1; }, kBound * 4));
  std::vector<FencedSender> fenced = tracker_->FencedSenders();
  ASSERT_EQ(fenced.size(), 1u);
  EXPECT_EQ(fenced[0].name, "prefill");
  EXPECT_EQ(fenced[0].unconfirmed_transfers, 1);
  EXPECT_EQ(fenced[0].revoked, !shm());
  // It wakes up: its responder answers D's asks (the first, or one D sends again over a fresh
  // endpoint where the fence closed the old one).
  ASSERT_TRUE(PumpUntil(
      [&] {
        sender_->ServeQuietRequests();
        return tracker_->fenced_senders() == 0;
      },
      absl::Seconds(3)));
  EXPECT_EQ(tracker_->fences_lifted(), 1);
  EXPECT_TRUE(tracker_->FencedSenders().empty());
  EXPECT_EQ(tracker_->quarantined_blocks(), 0);
  EXPECT_EQ(d_pool_->Stats().free, kBlocks);
  // A new request between the pair streams and lands.
  const PeerId peer = *d_->Redial(to_p_, DeadlineIn(absl::Seconds(1)));
  EXPECT_FALSE(tracker_->IsFenced(peer));
  std::vector<kv::BlockId> local = *p_pool_->Allocate(2);
  std::vector<kv::BlockId> remote = *d_pool_->Allocate(2);
  ASSERT_TRUE(tracker_->Expect(9, peer, remote, DeadlineIn(absl::Seconds(5))).ok());
  ASSERT_TRUE(sender_->Begin({9, to_d_, local, remote}).ok());
  ASSERT_TRUE(sender_->OnLayerDone(0, {9}).ok());
  ASSERT_TRUE(sender_->OnLayerDone(1, {9}).ok());
  ASSERT_TRUE(sender_->Finish(9, "first-token").ok());
  absl::StatusOr<std::string> ready = tracker_->WaitReady(9, DeadlineIn(absl::Seconds(2)));
  ASSERT_TRUE(ready.ok()) << ready.status();
  EXPECT_EQ(*ready, "first-token");
}

// P's link to D black-holed: its cancelled writes stay pending on its endpoint (as on a tcp
// connection in retransmission backoff), so it cannot confirm them quiet and is fenced. Where
// the fence revoked them, D's asks say so and P closes that endpoint: the writes end, P answers
// once the link is back, and the fence lifts at once (not when tcp would next retransmit).
// Where they were not revoked (shared memory), P keeps its endpoint and the fence stays.
TEST_P(QuarantineBoundTest, WritesStuckOnABlackHoledLinkEndOnceTheFenceRevokedThem) {
  *black_hole_ = true;
  BeginAndAbort(11, 3);
  ASSERT_TRUE(PumpUntil(
      [&] {
        sender_->ServeQuietRequests();
        return tracker_->fenced_senders() == 1;
      },
      kBound * 4));
  if (shm()) {
    *black_hole_ = false;
    EXPECT_FALSE(PumpUntil(
        [&] {
          sender_->ServeQuietRequests();
          return tracker_->fenced_senders() == 0;
        },
        kBound * 2));
    EXPECT_TRUE(p_->PeerStatus(to_d_).ok()) << p_->PeerStatus(to_d_);
    return;
  }
  // D's revoked asks reach P while its writes are still black-holed: it drops them.
  ASSERT_TRUE(PumpUntil(
      [&] {
        sender_->ServeQuietRequests();
        return absl::IsFailedPrecondition(p_->PeerStatus(to_d_));
      },
      absl::Seconds(2)));
  *black_hole_ = false;  // the link is back
  const absl::Time back = absl::Now();
  ASSERT_TRUE(PumpUntil(
      [&] {
        sender_->ServeQuietRequests();
        return tracker_->fenced_senders() == 0;
      },
      absl::Seconds(2)));
  EXPECT_LT(absl::Now() - back, absl::Seconds(1));
  EXPECT_EQ(tracker_->fences_lifted(), 1);
  EXPECT_EQ(d_pool_->Stats().free, kBlocks);
  // A new request streams over a fresh endpoint and lands.
  const PeerId to_d = *p_->Connect(*d_->LocalAddress(), DeadlineIn(absl::Seconds(1)));
  EXPECT_NE(to_d, to_d_);
  const PeerId peer = *d_->Redial(to_p_, DeadlineIn(absl::Seconds(1)));
  std::vector<kv::BlockId> local = *p_pool_->Allocate(2);
  std::vector<kv::BlockId> remote = *d_pool_->Allocate(2);
  ASSERT_TRUE(tracker_->Expect(12, peer, remote, DeadlineIn(absl::Seconds(5))).ok());
  ASSERT_TRUE(sender_->Begin({12, to_d, local, remote}).ok());
  ASSERT_TRUE(sender_->OnLayerDone(0, {12}).ok());
  ASSERT_TRUE(sender_->OnLayerDone(1, {12}).ok());
  ASSERT_TRUE(sender_->Finish(12, "first-token").ok());
  absl::StatusOr<std::string> ready = tracker_->WaitReady(12, DeadlineIn(absl::Seconds(2)));
  ASSERT_TRUE(ready.ok()) << ready.status();
}

// P's own Abort of writes stuck in a black hole closes their endpoint rather than keep it
// waiting on the link: the writes end, the request is forgotten, and a later connection starts
// clean. Their bytes may still be in the network, so P confirms the request quiet only once D
// says it revoked P's writes (a fence, tcp-like); with shared memory it never does.
TEST_P(QuarantineBoundTest, AbortOfWritesStuckInABlackHoleClosesTheEndpoint) {
  *black_hole_ = true;
  std::vector<kv::BlockId> local = *p_pool_->Allocate(2);
  std::vector<kv::BlockId> remote = *d_pool_->Allocate(2);
  ASSERT_TRUE(tracker_->Expect(13, to_p_, remote, DeadlineIn(absl::Seconds(30))).ok());
  ASSERT_TRUE(sender_->Begin({13, to_d_, local, remote}).ok());
  ASSERT_TRUE(sender_->OnLayerDone(0, {13}).ok());
  const absl::Status aborted = sender_->Abort(13, DeadlineIn(absl::Milliseconds(50)), "gone");
  EXPECT_TRUE(absl::IsDeadlineExceeded(aborted)) << aborted;
  EXPECT_NE(aborted.message().find("endpoint was closed"), std::string::npos) << aborted;
  EXPECT_TRUE(absl::IsFailedPrecondition(p_->PeerStatus(to_d_))) << p_->PeerStatus(to_d_);
  EXPECT_EQ(sender_->active_requests(), 0);
  ASSERT_TRUE(p_pool_->Free(local).ok());
  *black_hole_ = false;
  // D gives up on it: its plain asks are not answered (bytes may still be on the way).
  ASSERT_TRUE(tracker_->Abort(13, "client went away").ok());
  tracker_->Pump();
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(sender_->ServeQuietRequests(), 0);
    tracker_->Pump();
  }
  EXPECT_EQ(tracker_->quarantined_blocks(), 2);
  // After the bound D fences P. Where that revoked P's writes, D says so and P confirms.
  const bool lifted = PumpUntil(
      [&] {
        sender_->ServeQuietRequests();
        return tracker_->fences_lifted() == 1;
      },
      kBound * 6);
  EXPECT_EQ(lifted, !shm());
  if (!shm()) EXPECT_EQ(d_pool_->Stats().free, kBlocks);
  if (shm()) EXPECT_EQ(tracker_->quarantined_blocks(), 2);  // held until P confirms or is gone
}

// A sender that never answers stays fenced and reported; one that comes back as a new process
// (instance) is a different sender, never fenced.
TEST_P(QuarantineBoundTest, SilentSenderStaysFencedAndItsNewIncarnationIsNot) {
  BeginAndAbort(4, 2);
  ASSERT_TRUE(PumpUntil([&] { return tracker_->fenced_senders() == 1; }, kBound * 4));
  EXPECT_FALSE(PumpUntil([&] { return tracker_->fenced_senders() == 0; }, kBound * 2));
  EXPECT_EQ(tracker_->FencedSenders().size(), 1u);
  auto reborn = *CreateTransport("inproc", {.name = "prefill", .layout = Layout()});
  auto region = *reborn->AllocateRegion(Layout().RegionBytes(kBlocks));
  const PeerId peer = *d_->Connect(*reborn->LocalAddress(), DeadlineIn(absl::Seconds(1)));
  EXPECT_FALSE(tracker_->IsFenced(peer));
  std::vector<kv::BlockId> remote = *d_pool_->Allocate(1);
  EXPECT_TRUE(tracker_->Expect(10, peer, remote, DeadlineIn(absl::Seconds(1))).ok());
  EXPECT_TRUE(tracker_->Abort(10, "test over").ok());
}

TEST_P(QuarantineBoundTest, OverdueBlocksOfASilentSenderAreReleasedWhenItIsGone) {
  BeginAndAbort(6, 3);
  ASSERT_TRUE(PumpUntil([&] { return tracker_->fenced_senders() == 1; }, kBound * 4));
  if (!shm()) {
    EXPECT_EQ(tracker_->quarantined_blocks(), 0);
    return;
  }
  EXPECT_EQ(tracker_->quarantined_overdue_blocks(), 3);
  absl::SleepFor(kBound);
  tracker_->Pump();
  EXPECT_EQ(tracker_->quarantined_blocks(), 3);  // alive and mapped: still held
  sender_.reset();
  p_.reset();  // its process is gone: nothing can land any more
  tracker_->Pump();
  EXPECT_EQ(tracker_->quarantined_blocks(), 0);
  EXPECT_EQ(d_pool_->Stats().free, kBlocks);
}

TEST_P(QuarantineBoundTest, WaitingRequestsOfAFencedSenderFail) {
  BeginAndAbort(7, 2);
  std::vector<kv::BlockId> remote = *d_pool_->Allocate(2);
  ASSERT_TRUE(tracker_->Expect(8, to_p_, remote, DeadlineIn(absl::Seconds(30))).ok());
  ASSERT_TRUE(PumpUntil([&] { return tracker_->fenced_senders() == 1; }, kBound * 4));
  absl::StatusOr<std::string> r = tracker_->WaitReady(8, DeadlineIn(absl::Seconds(1)));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(tracker_->quarantined_blocks(), shm() ? 4 : 0);
}

INSTANTIATE_TEST_SUITE_P(Transports, QuarantineBoundTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "SharedMemory" : "Revocable";
                         });

}  // namespace
}  // namespace duet::transfer
