// The bound on quarantine with two real processes over UCX (shm and tcp on 127.0.0.1): the
// sender (transfer_test_peer --mode=stall) is stopped with SIGSTOP after its first layer landed
// and the receiver (this test) aborts every request. Over tcp the receiver fences the silent
// sender after the bound and gets its blocks back (its writes are revoked: a late write after
// SIGCONT does not land); over shm it cannot revoke a mapping, so the blocks stay quarantined
// and are reported overdue until the sender, continued, answers quiet (docs/design.md
// invariant 4). Either way the fence lifts once the continued sender has confirmed every
// transfer it was fenced for, and the pair serves again. No block leaks.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/kv/block_pool.h"
#include "tests/integration/transfer_test_util.h"
#include "transfer/kv_stream/kv_arrival_tracker.h"
#include "transfer/transport.h"
#include "transfer/ucx/ucx_transport.h"

namespace duet::transfer::testing {
namespace {

constexpr int kLayers = 4;
constexpr int64_t kBlocks = 1024;
constexpr int kRequests = 8;
constexpr int kBlocksPerRequest = 4;
constexpr absl::Duration kBound = absl::Seconds(2);
constexpr absl::Duration kMargin = absl::Seconds(2);

kv::KvLayout Layout() {
  return kv::KvLayout{.model_id = "test",
                      .num_layers = kLayers,
                      .num_kv_heads = 4,
                      .head_dim = 64,
                      .block_size = 16,
                      .dtype = kv::KvDtype::kBF16};
}

class QuarantineTwoProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    SetMinLogLevel(LogLevel::kError);
    char tmpl[] = "/tmp/duet_quarantine_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto profile = UcxProfileByName(GetParam());
    ASSERT_TRUE(profile.ok());
    auto t = CreateTransport("ucx", {.name = "test-receiver",
                                     .layout = Layout(),
                                     .tls = profile->tls,
                                     .net_devices = profile->net_devices});
    ASSERT_TRUE(t.ok()) << t.status();
    transport_ = std::move(*t);
    auto region = transport_->AllocateRegion(Layout().RegionBytes(kBlocks));
    ASSERT_TRUE(region.ok()) << region.status();
    region_ = std::move(*region);
    pool_ = *kv::BlockPool::CreateOver(Layout(), kBlocks, region_->base(), region_->bytes());
    tracker_ = std::make_unique<KvArrivalTracker>(
        transport_.get(), pool_.get(), KvArrivalTrackerOptions{.quarantine_bound = kBound});
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/recv.addr", *transport_->LocalAddress()));
  }
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);  // also ends a stopped process
      ::waitpid(pid_, nullptr, 0);
    }
    tracker_.reset();
    pool_.reset();
    region_.reset();
    transport_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void SpawnPeer() {
    std::vector<std::string> args = {DUET_TRANSFER_PEER_BIN,
                                     "--dir=" + dir_,
                                     "--profile=" + GetParam(),
                                     "--mode=stall",
                                     "--seed=5",
                                     "--model=test",
                                     absl::StrCat("--layers=", kLayers),
                                     "--heads=4",
                                     "--dim=64",
                                     "--block=16",
                                     "--blocks=1024",
                                     "--timeout_s=40"};
    pid_ = ::fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
  }

  // Pumps the tracker until `done` or `limit`; true if `done`.
  bool PumpUntil(const std::function<bool()>& done, absl::Duration limit) {
    const absl::Time deadline = DeadlineIn(limit);
    while (!done()) {
      if (absl::Now() >= deadline) return false;
      tracker_->Pump();
      transport_->WaitForNotices(DeadlineIn(absl::Milliseconds(5)));
    }
    return true;
  }

  bool BlocksHold(const std::vector<kv::BlockId>& blocks, uint8_t value) {
    for (int l = 0; l < kLayers; ++l) {
      for (kv::BlockId b : blocks) {
        const uint8_t* p = pool_->BlockAddress(l, b);
        for (size_t i = 0; i < Layout().BlockBytes(); ++i) {
          if (p[i] != value) return false;
        }
      }
    }
    return true;
  }

  std::string dir_;
  pid_t pid_ = -1;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<MemoryRegion> region_;
  std::unique_ptr<kv::BlockPool> pool_;
  std::unique_ptr<KvArrivalTracker> tracker_;
};

TEST_P(QuarantineTwoProcessTest, StoppedSenderIsFencedOrReportedOverdue) {
  const bool revocable = GetParam() == "tcp";
  SpawnPeer();
  auto addr = WaitForFile(dir_ + "/send.addr", DeadlineIn(absl::Seconds(20)));
  ASSERT_TRUE(addr.ok()) << addr.status();
  auto sender = transport_->Connect(*addr, DeadlineIn(absl::Seconds(10)));
  ASSERT_TRUE(sender.ok()) << sender.status();
  std::vector<PlannedRequest> plan;
  for (int r = 0; r < kRequests; ++r) {
    plan.push_back({static_cast<uint64_t>(500 + r), *pool_->Allocate(kBlocksPerRequest)});
    ASSERT_TRUE(tracker_
                    ->Expect(plan.back().id, *sender, plan.back().remote_blocks,
                             DeadlineIn(absl::Seconds(60)))
                    .ok());
  }
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/plan", EncodePlan(plan)));
  ASSERT_TRUE(PumpUntil(
      [&] {
        for (const PlannedRequest& r : plan) {
          if (tracker_->Query(r.id)->layers_landed < 1) return false;
        }
        return true;
      },
      absl::Seconds(20)));

  // The sender stays alive but says nothing; the receiver gives up on every request.
  ASSERT_EQ(::kill(pid_, SIGSTOP), 0);
  for (const PlannedRequest& r : plan) {
    ASSERT_TRUE(tracker_->Abort(r.id, "client went away").ok());
    EXPECT_EQ(tracker_->WaitReady(r.id, absl::InfinitePast()).status().code(),
              absl::StatusCode::kAborted);
  }
  // Every request's blocks, except those of a request whose writes all ended (and whose sender
  // said so) before the stop took effect: nothing more can land in those.
  const int64_t held = tracker_->quarantined_blocks();
  ASSERT_GT(held, 0);
  EXPECT_LE(held, kRequests * kBlocksPerRequest);
  EXPECT_EQ(held % kBlocksPerRequest, 0);
  const Stopwatch since_abort;
  if (revocable) {
    // Fenced after the bound; the fence revokes its writes, so the blocks come back.
    ASSERT_TRUE(PumpUntil([&] { return tracker_->quarantined_blocks() == 0; }, kBound + kMargin))
        << tracker_->quarantined_blocks() << " blocks still quarantined after "
        << since_abort.ElapsedSeconds() << " s";
    RecordProperty("released_after_abort_s", absl::StrCat(since_abort.ElapsedSeconds()));
    EXPECT_GE(since_abort.ElapsedSeconds(), absl::ToDoubleSeconds(kBound) - 0.1);
    EXPECT_EQ(tracker_->fenced_senders(), 1);
    EXPECT_EQ(pool_->Stats().free, kBlocks);
  } else {
    // Shared memory: fenced, but a mapping cannot be revoked: held, and reported overdue.
    EXPECT_TRUE(PumpUntil([&] { return tracker_->fenced_senders() == 1; }, kBound + kMargin));
    PumpUntil([] { return false; }, absl::Milliseconds(300));
    // Held and overdue (a notice already in flight at the stop may have released one request).
    EXPECT_GT(tracker_->quarantined_blocks(), 0);
    EXPECT_LE(tracker_->quarantined_blocks(), held);
    EXPECT_EQ(tracker_->quarantined_overdue_blocks(), tracker_->quarantined_blocks());
  }

  if (revocable) {
    // A late write of the fenced sender into blocks that are free again must not land: it is
    // made (below) as soon as the sender runs again, before the receiver has heard its answer.
    for (int l = 0; l < kLayers; ++l) {
      for (kv::BlockId b : plan[0].remote_blocks) {
        std::memset(pool_->BlockAddress(l, b), 0, Layout().BlockBytes());
      }
    }
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/late", ""));
  }
  // It wakes up: it answers the quiet requests it was sent (shm: that releases the blocks).
  ASSERT_EQ(::kill(pid_, SIGCONT), 0);
  const Stopwatch since_cont;
  if (revocable) {
    auto late = WaitForFile(dir_ + "/send.late", DeadlineIn(absl::Seconds(10)));
    ASSERT_TRUE(late.ok()) << late.status();
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_TRUE(BlocksHold(plan[0].remote_blocks, 0))
        << "a write of the fenced sender landed (sender saw: " << *late << ")";
  }
  ASSERT_TRUE(PumpUntil([&] { return tracker_->quarantined_blocks() == 0; }, absl::Seconds(5)))
      << tracker_->quarantined_blocks() << " blocks still quarantined after SIGCONT";
  RecordProperty("released_after_sigcont_s", absl::StrCat(since_cont.ElapsedSeconds()));
  EXPECT_EQ(tracker_->quarantined_overdue_blocks(), 0);
  EXPECT_EQ(pool_->Stats().free, kBlocks);
  EXPECT_EQ(pool_->Stats().quarantined, 0);

  // The fence lasts only until the sender has confirmed every transfer it was fenced for: then
  // the pair serves again.
  ASSERT_TRUE(PumpUntil([&] { return tracker_->fenced_senders() == 0; }, absl::Seconds(5)))
      << "still fenced " << since_cont.ElapsedSeconds() << " s after SIGCONT";
  RecordProperty("fence_lifted_after_sigcont_s", absl::StrCat(since_cont.ElapsedSeconds()));
  EXPECT_EQ(tracker_->fences_lifted(), 1);
  if (revocable) EXPECT_EQ(transport_->Stats().pending_arrivals, 0);
  absl::StatusOr<PeerId> again = transport_->Redial(*sender, DeadlineIn(absl::Seconds(5)));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(tracker_->IsFenced(*again));
  std::vector<kv::BlockId> blocks = *pool_->Allocate(kBlocksPerRequest);
  ASSERT_TRUE(tracker_->Expect(600, *again, blocks, DeadlineIn(absl::Seconds(30))).ok());
  ASSERT_TRUE(tracker_->Abort(600, "test over").ok());  // the sender confirms it at once
  ASSERT_TRUE(PumpUntil([&] { return tracker_->quarantined_blocks() == 0; }, absl::Seconds(5)));
  EXPECT_EQ(tracker_->fenced_senders(), 0);
  EXPECT_EQ(pool_->Stats().free, kBlocks);
}

INSTANTIATE_TEST_SUITE_P(Ucx, QuarantineTwoProcessTest, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace duet::transfer::testing
