#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "common/base/clock.h"
#include "absl/synchronization/notification.h"
#include "common/kv/block_pool.h"
#include "transfer/kv_stream/kv_arrival_tracker.h"
#include "transfer/kv_stream/kv_notice.h"
#include "transfer/kv_stream/kv_stream_sender.h"
#include "transfer/transport.h"

namespace duet::transfer {
namespace {

constexpr int kLayers = 3;

kv::KvLayout Layout() {
  return kv::KvLayout{.model_id = "tiny",
                      .num_layers = kLayers,
                      .num_kv_heads = 2,
                      .head_dim = 4,
                      .block_size = 2,
                      .dtype = kv::KvDtype::kF32};
}

// Staging as a prefill node on a GPU does it: a copy fills the exported region (here the test,
// when it "completes" a layer's copy), and the sender must not post a layer before then.
class Staging {
 public:
  // The wait the sender gets; OK once Complete() ran, `error_` once Fail() ran.
  StagedWait Wait() {
    return [this](absl::Time deadline) {
      if (!done_.WaitForNotificationWithDeadline(deadline)) {
        return absl::DeadlineExceededError("staging copy not done");
      }
      return error_;
    };
  }
  void Complete() { done_.Notify(); }
  void Fail(absl::Status error) {
    error_ = std::move(error);
    done_.Notify();
  }

 private:
  absl::Notification done_;
  absl::Status error_;
};

// A prefill side (P) and a decode side (D) over inproc, connected both ways.
class KvStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    p_ = *CreateTransport("inproc", {.name = "prefill", .layout = Layout()});
    d_ = *CreateTransport("inproc", {.name = "decode", .layout = Layout()});
    p_region_ = *p_->AllocateRegion(Layout().RegionBytes(16));
    d_region_ = *d_->AllocateRegion(Layout().RegionBytes(32));
    p_pool_ = *kv::BlockPool::CreateOver(Layout(), 16, p_region_->base(), p_region_->bytes());
    d_pool_ = *kv::BlockPool::CreateOver(Layout(), 32, d_region_->base(), d_region_->bytes());
    to_d_ = *p_->Connect(*d_->LocalAddress(), DeadlineIn(absl::Seconds(1)));
    to_p_ = *d_->Connect(*p_->LocalAddress(), DeadlineIn(absl::Seconds(1)));
    sender_ = *KvStreamSender::Create(p_.get(), Layout(), 16);
    tracker_ = std::make_unique<KvArrivalTracker>(d_.get(), d_pool_.get());
  }

  void FillLocal(const std::vector<kv::BlockId>& blocks, int layer, uint8_t seed) {
    for (size_t i = 0; i < blocks.size(); ++i) {
      std::memset(p_pool_->BlockAddress(layer, blocks[i]), seed + static_cast<int>(i),
                  Layout().BlockBytes());
    }
  }

  // Request `id` over `n` blocks each side, expected by D, begun by P, every layer staged behind
  // `staging[layer]`.
  void BeginStaged(uint64_t id, int n, Staging* staging, std::vector<kv::BlockId>* local,
                   std::vector<kv::BlockId>* remote) {
    *local = *p_pool_->Allocate(n);
    *remote = *d_pool_->Allocate(n);
    ASSERT_TRUE(tracker_->Expect(id, to_p_, *remote, DeadlineIn(absl::Seconds(5))).ok());
    ASSERT_TRUE(sender_->Begin({id, to_d_, *local, *remote}).ok());
    for (int l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(sender_->OnLayerStaged(l, id, staging[l].Wait()).ok());
    }
  }

  std::unique_ptr<Transport> p_, d_;
  std::unique_ptr<MemoryRegion> p_region_, d_region_;
  std::unique_ptr<kv::BlockPool> p_pool_, d_pool_;
  PeerId to_d_ = 0, to_p_ = 0;
  std::unique_ptr<KvStreamSender> sender_;
  std::unique_ptr<KvArrivalTracker> tracker_;
};

// Notices survive encoding, a quiet ask's writes_revoked included (only there).
TEST(KvNoticeTest, RoundTripsEveryKind) {
  for (const KvNotice& n :
       {KvNotice{.kind = KvNoticeKind::kLayer, .request_id = 7, .layer = 3},
        KvNotice{.kind = KvNoticeKind::kFinal, .request_id = 8, .payload = "tok"},
        KvNotice{.kind = KvNoticeKind::kQuietRequest, .request_id = 9},
        KvNotice{.kind = KvNoticeKind::kQuietRequest, .request_id = 10, .writes_revoked = true},
        KvNotice{.kind = KvNoticeKind::kQuiet, .request_id = 11}}) {
    absl::StatusOr<KvNotice> back = DecodeKvNotice(EncodeKvNotice(n));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->kind, n.kind);
    EXPECT_EQ(back->request_id, n.request_id);
    EXPECT_EQ(back->layer, n.layer);
    EXPECT_EQ(back->payload, n.payload);
    EXPECT_EQ(back->writes_revoked, n.writes_revoked) << n.request_id;
  }
}

TEST_F(KvStreamTest, LayersThenFinalMakeReadyAndBytesMatch) {
  auto local = *p_pool_->Allocate(3);
  auto remote = *d_pool_->Allocate(3);
  ASSERT_TRUE(tracker_->Expect(1, to_p_, remote, DeadlineIn(absl::Seconds(5))).ok());
  ASSERT_TRUE(sender_->Begin({1, to_d_, local, remote}).ok());
  for (int l = 0; l < kLayers; ++l) {
    FillLocal(local, l, static_cast<uint8_t>(10 * (l + 1)));
    ASSERT_TRUE(sender_->OnLayerDone(l, {1}).ok());
    tracker_->Pump();
    auto st = *tracker_->Query(1);
    EXPECT_EQ(st.layers_landed, l + 1);
    EXPECT_EQ(st.state, ArrivalState::kWaiting);  // no final notice yet
  }
  EXPECT_FALSE(sender_->OnLayerDone(0, {1}).ok());  // a layer is posted once
  ASSERT_TRUE(sender_->Finish(1, "tok=42").ok());
  ASSERT_TRUE(sender_->Wait(1, DeadlineIn(absl::Seconds(1))).ok());
  auto payload = tracker_->WaitReady(1, DeadlineIn(absl::Seconds(1)));
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(*payload, "tok=42");
  for (int l = 0; l < kLayers; ++l) {
    for (size_t i = 0; i < local.size(); ++i) {
      EXPECT_EQ(std::memcmp(p_pool_->BlockAddress(l, local[i]), d_pool_->BlockAddress(l, remote[i]),
                            Layout().BlockBytes()),
                0);
    }
  }
  EXPECT_EQ(sender_->active_requests(), 0);
  EXPECT_EQ(d_pool_->Stats().used, 3);  // the caller owns the blocks now
}

TEST_F(KvStreamTest, FinalBeforeAllLayersIsNotReady) {
  auto remote = *d_pool_->Allocate(2);
  ASSERT_TRUE(tracker_->Expect(2, to_p_, remote, DeadlineIn(absl::Seconds(5))).ok());
  tracker_->OnNotice({to_p_, 0, EncodeKvNotice({.kind = KvNoticeKind::kFinal, .request_id = 2})});
  tracker_->OnNotice(
      {to_p_, 0, EncodeKvNotice({.kind = KvNoticeKind::kLayer, .request_id = 2, .layer = 0})});
  tracker_->OnNotice(
      {to_p_, 0, EncodeKvNotice({.kind = KvNoticeKind::kLayer, .request_id = 2, .layer = 0})});
  EXPECT_EQ(tracker_->Query(2)->layers_landed, 1);
  EXPECT_EQ(tracker_->Query(2)->state, ArrivalState::kWaiting);
  // A notice from the wrong peer is ignored.
  tracker_->OnNotice(
      {to_p_ + 99, 0, EncodeKvNotice({.kind = KvNoticeKind::kLayer, .request_id = 2, .layer = 1})});
  EXPECT_EQ(tracker_->Query(2)->layers_landed, 1);
  for (int l = 1; l < kLayers; ++l) {
    tracker_->OnNotice(
        {to_p_, 0, EncodeKvNotice({.kind = KvNoticeKind::kLayer, .request_id = 2, .layer = l})});
  }
  EXPECT_EQ(tracker_->Query(2)->state, ArrivalState::kReady);
}

TEST_F(KvStreamTest, ReceiverAbortQuarantinesUntilSenderConfirms) {
  auto local = *p_pool_->Allocate(2);
  auto remote = *d_pool_->Allocate(2);
  ASSERT_TRUE(tracker_->Expect(3, to_p_, remote, DeadlineIn(absl::Seconds(5))).ok());
  ASSERT_TRUE(sender_->Begin({3, to_d_, local, remote}).ok());
  ASSERT_TRUE(sender_->OnLayerDone(0, {3}).ok());
  ASSERT_TRUE(tracker_->Abort(3, "client went away").ok());
  EXPECT_TRUE(d_pool_->IsQuarantined(remote[0]));
  EXPECT_EQ(tracker_->quarantined_blocks(), 2);
  auto r = tracker_->WaitReady(3, DeadlineIn(absl::Seconds(1)));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  tracker_->Pump();  // a late layer notice does not release anything
  EXPECT_EQ(tracker_->quarantined_blocks(), 2);
  // The sender learns of the abort (control plane) and confirms nothing is in flight.
  ASSERT_TRUE(sender_->Abort(3, DeadlineIn(absl::Seconds(1)), "receiver aborted").ok());
  tracker_->Pump();
  EXPECT_EQ(tracker_->quarantined_blocks(), 0);
  EXPECT_EQ(d_pool_->Stats().free, 32);
}

TEST_F(KvStreamTest, DeadlineQuarantinesAndLostPeerReleases) {
  auto remote = *d_pool_->Allocate(4);
  ASSERT_TRUE(tracker_->Expect(4, to_p_, remote, DeadlineIn(absl::Milliseconds(20))).ok());
  auto r = tracker_->WaitReady(4, DeadlineIn(absl::Seconds(2)));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("0/3 layers"), std::string::npos) << r.status();
  EXPECT_EQ(d_pool_->Stats().quarantined, 4);
  tracker_->Pump();
  EXPECT_EQ(d_pool_->Stats().quarantined, 4);  // sender alive and silent: stays quarantined
  sender_.reset();
  p_.reset();  // the sender's endpoint is gone: no write can land any more
  tracker_->Pump();
  EXPECT_EQ(d_pool_->Stats().quarantined, 0);
  EXPECT_EQ(d_pool_->Stats().free, 32);
}

TEST_F(KvStreamTest, SenderAbortFailsRequestAndFreesBlocks) {
  auto local = *p_pool_->Allocate(1);
  auto remote = *d_pool_->Allocate(1);
  ASSERT_TRUE(tracker_->Expect(5, to_p_, remote, DeadlineIn(absl::Seconds(5))).ok());
  ASSERT_TRUE(sender_->Begin({5, to_d_, local, remote}).ok());
  ASSERT_TRUE(sender_->OnLayerDone(0, {5}).ok());
  ASSERT_TRUE(sender_->Abort(5, DeadlineIn(absl::Seconds(1)), "prefill failed").ok());
  auto r = tracker_->WaitReady(5, DeadlineIn(absl::Seconds(1)));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(r.status().message().find("prefill failed"), std::string::npos);
  EXPECT_EQ(d_pool_->Stats().free, 32);
}

TEST_F(KvStreamTest, LostSenderFailsWaitingRequest) {
  auto remote = *d_pool_->Allocate(2);
  ASSERT_TRUE(tracker_->Expect(6, to_p_, remote, DeadlineIn(absl::Seconds(5))).ok());
  sender_.reset();
  p_.reset();
  auto r = tracker_->WaitReady(6, DeadlineIn(absl::Seconds(1)));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(d_pool_->Stats().free, 32);
}

TEST_F(KvStreamTest, BeginRejectsBadMaps) {
  EXPECT_FALSE(sender_->Begin({7, to_d_, {0, 1}, {0}}).ok());
  EXPECT_FALSE(sender_->Begin({7, to_d_, {0}, {32}}).ok());  // decode pool has 32 blocks
  EXPECT_FALSE(sender_->Begin({7, to_d_ + 5, {0}, {0}}).ok());
  EXPECT_TRUE(sender_->Begin({7, to_d_, {0}, {31}}).ok());
  EXPECT_EQ(sender_->Begin({7, to_d_, {0}, {31}}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(sender_->Finish(7, "").ok());  // layers missing
}

TEST_F(KvStreamTest, StagedLayersArePostedOnlyOnceTheirCopyIsDoneInLayerOrder) {
  std::vector<kv::BlockId> local, remote;
  Staging staging[kLayers];
  ASSERT_NO_FATAL_FAILURE(BeginStaged(8, 3, staging, &local, &remote));
  EXPECT_FALSE(sender_->OnLayerStaged(0, 8, staging[0].Wait()).ok());  // a layer is staged once
  EXPECT_FALSE(sender_->OnLayerDone(1, {8}).ok());                     // ... and not also posted
  ASSERT_TRUE(sender_->Finish(8, "tok=7").ok());  // held until the staged layers are posted

  // Nothing is copied yet: nothing may be posted.
  EXPECT_EQ(*sender_->PostStaged(8, absl::InfinitePast()), 0);
  EXPECT_EQ(*sender_->PostStaged(8, DeadlineIn(absl::Milliseconds(20))), 0);
  EXPECT_EQ(p_->Stats().bytes_posted, 0u);
  // Layer 1's copy ends first: layer 0 still holds it back (layers go in order).
  FillLocal(local, 1, 60);
  staging[1].Complete();
  EXPECT_EQ(*sender_->PostStaged(8, absl::InfinitePast()), 0);
  EXPECT_EQ(p_->Stats().bytes_posted, 0u);
  FillLocal(local, 0, 30);
  staging[0].Complete();
  EXPECT_EQ(*sender_->PostStaged(8, absl::InfinitePast()), 2);
  tracker_->Pump();
  EXPECT_EQ(tracker_->Query(8)->layers_landed, 2);
  EXPECT_EQ(tracker_->Query(8)->state, ArrivalState::kWaiting);  // the final waits for layer 2
  // Wait posts what staging still holds, and gives up at its deadline keeping the request.
  EXPECT_EQ(sender_->Wait(8, DeadlineIn(absl::Milliseconds(20))).code(),
            absl::StatusCode::kDeadlineExceeded);
  // The last copy completes on another thread while PostStaged waits for it.
  std::thread copier([&] {
    absl::SleepFor(absl::Milliseconds(30));
    FillLocal(local, 2, 90);
    staging[2].Complete();
  });
  EXPECT_EQ(*sender_->PostStaged(8, DeadlineIn(absl::Seconds(5))), kLayers);
  copier.join();
  ASSERT_TRUE(sender_->Wait(8, DeadlineIn(absl::Seconds(1))).ok());
  auto payload = tracker_->WaitReady(8, DeadlineIn(absl::Seconds(1)));
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(*payload, "tok=7");
  // Each layer left P after its copy: D holds the bytes written before Complete().
  for (int l = 0; l < kLayers; ++l) {
    for (size_t i = 0; i < local.size(); ++i) {
      EXPECT_EQ(std::memcmp(p_pool_->BlockAddress(l, local[i]),
                            d_pool_->BlockAddress(l, remote[i]), Layout().BlockBytes()),
                0)
          << "layer " << l << " block " << i;
    }
  }
}

TEST_F(KvStreamTest, FailedStagingFailsPostAndAbortDropsTheRest) {
  std::vector<kv::BlockId> local, remote;
  Staging staging[kLayers];
  ASSERT_NO_FATAL_FAILURE(BeginStaged(9, 1, staging, &local, &remote));
  staging[0].Fail(absl::InternalError("copy engine fault"));
  auto posted = sender_->PostStaged(9, absl::InfinitePast());
  EXPECT_EQ(posted.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(posted.status().message().find("staging layer 0"), std::string::npos) << posted.status();
  ASSERT_TRUE(sender_->Abort(9, DeadlineIn(absl::Seconds(1)), "staging failed").ok());
  staging[1].Complete();  // too late: the request is gone, nothing more is posted
  EXPECT_EQ(sender_->PostStaged(9, absl::InfinitePast()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(p_->Stats().bytes_posted, 0u);
  auto r = tracker_->WaitReady(9, DeadlineIn(absl::Seconds(1)));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_EQ(d_pool_->Stats().free, 32);
}

}  // namespace
}  // namespace duet::transfer
