// Two real processes over UCX (shm and tcp on 127.0.0.1): this test is the receiving (decode)
// side with a KvArrivalTracker; transfer_test_peer is the sending (prefill) side.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/kv/block_pool.h"
#include "tests/integration/transfer_test_util.h"
#include "transfer/kv_stream/kv_arrival_tracker.h"
#include "transfer/kv_stream/kv_notice.h"
#include "transfer/transport.h"
#include "transfer/ucx/ucx_transport.h"

namespace duet::transfer::testing {
namespace {

struct Geometry {
  int layers = 2;
  int heads = 4;
  int dim = 64;
  int block = 16;
  kv::KvLayout Layout(const std::string& model = "test") const {
    return kv::KvLayout{.model_id = model,
                        .num_layers = layers,
                        .num_kv_heads = heads,
                        .head_dim = dim,
                        .block_size = block,
                        .dtype = kv::KvDtype::kBF16};
  }
};

class TwoProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    SetMinLogLevel(LogLevel::kError);
    char tmpl[] = "/tmp/duet_transfer_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    KillPeer();
    tracker_.reset();
    pool_.reset();
    region_.reset();
    transport_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  void KillPeer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  // Exit code of the peer, or -1 if it did not exit by `deadline`.
  int WaitPeer(absl::Time deadline) {
    while (pid_ > 0) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (absl::Now() >= deadline) return -1;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return -1;
  }

  void StartReceiver(const Geometry& g, int64_t num_blocks) {
    geometry_ = g;
    auto profile = UcxProfileByName(GetParam());
    ASSERT_TRUE(profile.ok());
    TransportOptions opt{.name = "test-receiver",
                         .layout = g.Layout(),
                         .tls = profile->tls,
                         .net_devices = profile->net_devices};
    auto t = CreateTransport("ucx", opt);
    ASSERT_TRUE(t.ok()) << t.status();
    transport_ = std::move(*t);
    EXPECT_TRUE(transport_->Has(kCapCrossProcess));
    RecordProperty("device_memory", transport_->Has(kCapDeviceMemory) ? "yes" : "no");
    auto region = transport_->AllocateRegion(g.Layout().RegionBytes(num_blocks));
    ASSERT_TRUE(region.ok()) << region.status();
    region_ = std::move(*region);
    auto pool =
        kv::BlockPool::CreateOver(g.Layout(), num_blocks, region_->base(), region_->bytes());
    ASSERT_TRUE(pool.ok());
    pool_ = std::move(*pool);
    tracker_ = std::make_unique<KvArrivalTracker>(transport_.get(), pool_.get());
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/recv.addr", *transport_->LocalAddress()));
  }

  void SpawnPeer(const std::string& mode, uint64_t seed, const std::string& model = "test",
                 int layer_ms = 0, const std::string& write_mode = "auto") {
    std::vector<std::string> args = {DUET_TRANSFER_PEER_BIN,
                                     "--dir=" + dir_,
                                     "--profile=" + GetParam(),
                                     "--mode=" + mode,
                                     absl::StrCat("--seed=", seed),
                                     "--model=" + model,
                                     absl::StrCat("--layers=", geometry_.layers),
                                     absl::StrCat("--heads=", geometry_.heads),
                                     absl::StrCat("--dim=", geometry_.dim),
                                     absl::StrCat("--block=", geometry_.block),
                                     absl::StrCat("--layer_ms=", layer_ms),
                                     "--blocks=1024",
                                     "--timeout_s=40",
                                     "--write_mode=" + write_mode};
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

  // Connects back to the sender (for liveness and notice attribution).
  PeerId ConnectBack() {
    auto addr = WaitForFile(dir_ + "/send.addr", DeadlineIn(absl::Seconds(20)));
    EXPECT_TRUE(addr.ok()) << addr.status();
    if (!addr.ok()) return 0;
    auto peer = transport_->Connect(*addr, DeadlineIn(absl::Seconds(10)));
    EXPECT_TRUE(peer.ok()) << peer.status();
    return peer.ok() ? *peer : 0;
  }

  // Destination blocks for each request; odd requests get a shuffled (non-contiguous) map.
  std::vector<PlannedRequest> MakePlan(std::mt19937_64& rng, int n, int max_blocks,
                                       int big_blocks) {
    std::vector<PlannedRequest> plan;
    for (int r = 0; r < n; ++r) {
      const int count = r == 0 && big_blocks > 0
                            ? big_blocks
                            : 1 + static_cast<int>(rng() % static_cast<uint64_t>(max_blocks));
      auto blocks = pool_->Allocate(count);
      EXPECT_TRUE(blocks.ok()) << blocks.status();
      if (r % 2 == 1) std::shuffle(blocks->begin(), blocks->end(), rng);
      plan.push_back(PlannedRequest{static_cast<uint64_t>(1000 + r), *blocks});
    }
    return plan;
  }

  std::string PeerError() {
    auto err = WaitForFile(dir_ + "/send.err", absl::Now());
    return err.ok() ? *err : "(no error file)";
  }

  bool LayerMatches(const PlannedRequest& r, int layer, uint64_t seed) {
    for (size_t i = 0; i < r.remote_blocks.size(); ++i) {
      if (!BlockMatches(pool_->BlockAddress(layer, r.remote_blocks[i]),
                        geometry_.Layout().BlockBytes(), seed, r.id, layer, i)) {
        return false;
      }
    }
    return true;
  }

  // Drains notices: every layer notice must find its layer's bytes already in place.
  void DrainAndCheck(const std::map<uint64_t, PlannedRequest>& by_id, uint64_t seed,
                     int* early_notices, int* layer_notices) {
    transport_->WaitForNotices(DeadlineIn(absl::Milliseconds(5)));
    for (const Notice& n : transport_->DrainNotices()) {
      auto kn = DecodeKvNotice(n.payload);
      ASSERT_TRUE(kn.ok());
      if (kn->kind == KvNoticeKind::kLayer && by_id.count(kn->request_id)) {
        ++*layer_notices;
        if (!LayerMatches(by_id.at(kn->request_id), kn->layer, seed)) ++*early_notices;
      }
      tracker_->OnNotice(n);
    }
  }

  std::string dir_;
  pid_t pid_ = -1;
  Geometry geometry_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<MemoryRegion> region_;
  std::unique_ptr<kv::BlockPool> pool_;
  std::unique_ptr<KvArrivalTracker> tracker_;
};

// 64 concurrent requests (plus one large, chunked run) with random block maps and a random
// layer count arrive byte-exact; no layer notice precedes its data.
TEST_P(TwoProcessTest, RandomMapsArriveByteExact) {
  for (uint64_t seed : {11u, 12u}) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    std::mt19937_64 rng(seed * 7919);
    Geometry g{.layers = 1 + static_cast<int>(rng() % 6)};
    StartReceiver(g, 1024);
    // shm: the first run forces ucp_put_nbx (cma); the second, the default, copies straight
    // into the peer region that UCX mapped here. tcp: rendezvous messages either way.
    const bool direct = GetParam() == "shm" && seed == 12;
    SpawnPeer("stream", seed, "test", 0, GetParam() == "shm" && !direct ? "put" : "auto");
    const PeerId sender = ConnectBack();
    ASSERT_NE(sender, 0u);
    std::vector<PlannedRequest> plan = MakePlan(rng, 64, 8, /*big_blocks=*/160);  // 2.5 MiB/layer
    std::map<uint64_t, PlannedRequest> by_id;
    for (const PlannedRequest& r : plan) {
      ASSERT_TRUE(
          tracker_->Expect(r.id, sender, r.remote_blocks, DeadlineIn(absl::Seconds(30))).ok());
      by_id[r.id] = r;
    }
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/plan", EncodePlan(plan)));

    int early = 0, layer_notices = 0;
    std::set<uint64_t> pending;
    for (const auto& r : plan) pending.insert(r.id);
    const absl::Time deadline = DeadlineIn(absl::Seconds(30));
    while (!pending.empty() && absl::Now() < deadline) {
      DrainAndCheck(by_id, seed, &early, &layer_notices);
      for (auto it = pending.begin(); it != pending.end();) {
        auto st = tracker_->Query(*it);
        ASSERT_TRUE(st.ok());
        ASSERT_NE(st->state, ArrivalState::kFailed) << st->error;
        if (st->state != ArrivalState::kReady) {
          ++it;
          continue;
        }
        EXPECT_EQ(st->payload, absl::StrCat("first-token:", *it));
        for (int l = 0; l < g.layers; ++l) {
          EXPECT_TRUE(LayerMatches(by_id[*it], l, seed)) << "request " << *it << " layer " << l;
        }
        it = pending.erase(it);
      }
    }
    EXPECT_TRUE(pending.empty()) << pending.size() << " requests never became ready";
    EXPECT_EQ(early, 0) << "layer notices that arrived before their data";
    EXPECT_EQ(layer_notices, 64 * g.layers);
    for (const PlannedRequest& r : plan) {
      auto payload = tracker_->WaitReady(r.id, DeadlineIn(absl::Seconds(1)));
      ASSERT_TRUE(payload.ok()) << payload.status();
      ASSERT_TRUE(pool_->Free(r.remote_blocks).ok());
    }
    WriteFileAtomic(dir_ + "/recv.done", "");
    EXPECT_EQ(WaitPeer(DeadlineIn(absl::Seconds(10))), 0) << PeerError();
    auto lane = WaitForFile(dir_ + "/send.done", absl::Now());
    ASSERT_TRUE(lane.ok());
    RecordProperty(absl::StrCat("lane_seed_", seed), *lane);
    // shm: the forced put lane, or by default the mapped region; tcp has no RMA lane: am.
    EXPECT_EQ(*lane, GetParam() == "tcp" ? "am" : (direct ? "memcpy" : "put"));
    EXPECT_EQ(pool_->Stats().free, 1024);
    TearDown();
    SetUp();
  }
}

// SIGKILL of the sender mid-stream: every waiting request fails with Unavailable well within
// its deadline, and every block comes back to the pool.
TEST_P(TwoProcessTest, KilledSenderFailsRequestsAndReturnsBlocks) {
  StartReceiver(Geometry{.layers = 8}, 1024);
  SpawnPeer("slow", 21, "test", /*layer_ms=*/150);
  const PeerId sender = ConnectBack();
  ASSERT_NE(sender, 0u);
  std::mt19937_64 rng(21);
  std::vector<PlannedRequest> plan = MakePlan(rng, 16, 8, 0);
  for (const PlannedRequest& r : plan) {
    ASSERT_TRUE(
        tracker_->Expect(r.id, sender, r.remote_blocks, DeadlineIn(absl::Seconds(60))).ok());
  }
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/plan", EncodePlan(plan)));
  // Wait until some layer has landed, then kill the sender mid-stream.
  const absl::Time deadline = DeadlineIn(absl::Seconds(20));
  bool landed = false;
  while (!landed && absl::Now() < deadline) {
    tracker_->Pump();
    landed = tracker_->Query(plan[0].id)->layers_landed > 0;
    transport_->WaitForNotices(DeadlineIn(absl::Milliseconds(2)));
  }
  ASSERT_TRUE(landed);
  ::kill(pid_, SIGKILL);
  const Stopwatch since_kill;
  for (const PlannedRequest& r : plan) {
    auto result = tracker_->WaitReady(r.id, DeadlineIn(absl::Seconds(5)));
    EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
  }
  EXPECT_LT(since_kill.ElapsedSeconds(), 3.0);
  EXPECT_EQ(pool_->Stats().free, 1024);
  EXPECT_EQ(pool_->Stats().quarantined, 0);
  EXPECT_FALSE(transport_->PeerStatus(sender).ok());
}

// Sender aborts half its requests mid-stream; the receiver aborts a quarter itself (their
// blocks stay quarantined until the sender's final notice says nothing is in flight); the rest
// arrive byte-exact. Every block comes back.
TEST_P(TwoProcessTest, AbortMidStreamReturnsEveryBlock) {
  StartReceiver(Geometry{.layers = 4}, 1024);
  SpawnPeer("abort", 31);
  const PeerId sender = ConnectBack();
  ASSERT_NE(sender, 0u);
  std::mt19937_64 rng(31);
  std::vector<PlannedRequest> plan = MakePlan(rng, 16, 8, 0);
  for (const PlannedRequest& r : plan) {
    ASSERT_TRUE(
        tracker_->Expect(r.id, sender, r.remote_blocks, DeadlineIn(absl::Seconds(30))).ok());
  }
  for (size_t r = 1; r < plan.size(); r += 4) {
    ASSERT_TRUE(tracker_->Abort(plan[r].id, "receiver gave up").ok());
  }
  EXPECT_GT(tracker_->quarantined_blocks(), 0);
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/plan", EncodePlan(plan)));
  for (size_t r = 0; r < plan.size(); ++r) {
    auto result = tracker_->WaitReady(plan[r].id, DeadlineIn(absl::Seconds(20)));
    if (r % 2 == 0) {
      EXPECT_EQ(result.status().code(), absl::StatusCode::kAborted) << result.status();
      EXPECT_NE(result.status().message().find("test abort"), std::string::npos);
    } else if (r % 4 == 1) {
      EXPECT_EQ(result.status().code(), absl::StatusCode::kAborted) << result.status();
    } else {
      ASSERT_TRUE(result.ok()) << result.status();
      for (int l = 0; l < 4; ++l) EXPECT_TRUE(LayerMatches(plan[r], l, 31));
      ASSERT_TRUE(pool_->Free(plan[r].remote_blocks).ok());
    }
  }
  const absl::Time deadline = DeadlineIn(absl::Seconds(10));
  while (tracker_->quarantined_blocks() > 0 && absl::Now() < deadline) {
    tracker_->Pump();
    transport_->WaitForNotices(DeadlineIn(absl::Milliseconds(5)));
  }
  EXPECT_EQ(tracker_->quarantined_blocks(), 0);
  EXPECT_EQ(pool_->Stats().free, 1024);
  // While the sender is still connected (its exit clears its records anyway): the cancelled
  // and aborted writes left no receive-side record (the "am" lane counts landed bytes per
  // write until its notice, or the sender's discard notice, settles them).
  const absl::Time quiet = DeadlineIn(absl::Seconds(5));
  while (transport_->Stats().pending_arrivals > 0 && absl::Now() < quiet) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(transport_->Stats().pending_arrivals, 0);
  EXPECT_GT(transport_->Stats().notices_received, 0u);
  WriteFileAtomic(dir_ + "/recv.done", "");
  EXPECT_EQ(WaitPeer(DeadlineIn(absl::Seconds(10))), 0) << PeerError();
  // Closing the endpoint to a (now exited) peer ends cleanly; the peer id is then closed.
  EXPECT_TRUE(transport_->Disconnect(sender, DeadlineIn(absl::Seconds(2))).ok());
  EXPECT_EQ(transport_->PeerStatus(sender).code(), absl::StatusCode::kFailedPrecondition);
  auto cancel = WaitForFile(dir_ + "/send.cancel", absl::Now());
  ASSERT_TRUE(cancel.ok());
  EXPECT_TRUE(*cancel == "cancelled" || *cancel == "done") << *cancel;
}

// SIGKILL of the receiver while this process streams into it: every pending write fails with
// an error (not a hang) well within its deadline, and the transport stays usable.
TEST_P(TwoProcessTest, KilledReceiverFailsPendingWrites) {
  const Geometry g{.layers = 8};
  StartReceiver(g, 1024);  // here: this process's own transport, used as the sender
  SpawnPeer("receiver", 51);
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/send.addr.test", *transport_->LocalAddress()));
  auto addr = WaitForFile(dir_ + "/recv.ready", DeadlineIn(absl::Seconds(20)));
  ASSERT_TRUE(addr.ok()) << PeerError();
  auto peer_addr = WaitForFile(dir_ + "/recv.addr", DeadlineIn(absl::Seconds(1)));
  // recv.addr was overwritten by the peer with its own address.
  auto peer = transport_->Connect(*peer_addr, DeadlineIn(absl::Seconds(10)));
  ASSERT_TRUE(peer.ok()) << peer.status();
  // Whole-region writes (128 MiB each): the kill lands in the middle of them.
  const uint64_t bytes = g.Layout().RegionBytes(1024);
  std::vector<TransferHandle> handles;
  for (int i = 0; i < 8; ++i) {
    auto h = transport_->PostWrite(*peer, {{0, 0, bytes}}, "n");
    ASSERT_TRUE(h.ok()) << h.status();
    handles.push_back(*h);
  }
  ::kill(pid_, SIGKILL);
  const Stopwatch since_kill;
  for (int i = 0; i < 200 && transport_->PeerStatus(*peer).ok(); ++i) {
    auto h = transport_->PostWrite(*peer, {{0, 0, bytes}}, "n");
    if (!h.ok()) break;
    handles.push_back(*h);
    absl::SleepFor(absl::Milliseconds(5));
  }
  int failed = 0;
  for (const TransferHandle& h : handles) {
    absl::Status s = h.Wait(DeadlineIn(absl::Seconds(5)));
    ASSERT_FALSE(absl::IsDeadlineExceeded(s)) << "a write to a dead peer hung";
    failed += !s.ok();
  }
  EXPECT_LT(since_kill.ElapsedSeconds(), 3.0);
  EXPECT_EQ(transport_->PeerStatus(*peer).code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(transport_->PostWrite(*peer, {{0, 0, 64}}, "n").ok());
  RecordProperty("failed_writes", failed);
  EXPECT_GT(failed, 0) << "the kill did not interrupt any write";
  EXPECT_TRUE(transport_->Disconnect(*peer, DeadlineIn(absl::Seconds(2))).ok());
}

// A peer that does not answer (here: stopped with SIGSTOP) must not stall the worker: while
// our connect to it waits for its deadline, a connect to a live peer and a write to it finish.
// (The worker used to spin on the silent peer's flush and then on a graceful close, ~4 s in
// all, and every other connect queued behind it timed out.)
TEST_P(TwoProcessTest, SilentPeerDoesNotStallOtherConnects) {
  const Geometry g;
  StartReceiver(g, 64);
  SpawnPeer("receiver", 61);
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/send.addr.test", *transport_->LocalAddress()));
  ASSERT_TRUE(WaitForFile(dir_ + "/recv.ready", DeadlineIn(absl::Seconds(20))).ok())
      << PeerError();
  auto silent_addr = WaitForFile(dir_ + "/recv.addr", DeadlineIn(absl::Seconds(1)));
  ASSERT_TRUE(silent_addr.ok());
  ASSERT_EQ(::kill(pid_, SIGSTOP), 0);

  // A live peer in this process, on its own transport.
  auto profile = UcxProfileByName(GetParam());
  ASSERT_TRUE(profile.ok());
  auto live = CreateTransport("ucx", {.name = "live-peer",
                                      .layout = g.Layout(),
                                      .tls = profile->tls,
                                      .net_devices = profile->net_devices});
  ASSERT_TRUE(live.ok()) << live.status();
  auto live_region = (*live)->AllocateRegion(g.Layout().RegionBytes(64));
  ASSERT_TRUE(live_region.ok()) << live_region.status();

  absl::StatusOr<PeerId> silent = absl::UnknownError("not run");
  Stopwatch silent_sw;
  double silent_s = 0;
  std::thread t([&] {
    silent = transport_->Connect(*silent_addr, DeadlineIn(absl::Seconds(3)));
    silent_s = silent_sw.ElapsedSeconds();
  });
  absl::SleepFor(absl::Milliseconds(200));  // the silent connect is now on the worker
  Stopwatch live_sw;
  auto peer = transport_->Connect(*(*live)->LocalAddress(), DeadlineIn(absl::Seconds(1)));
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto h = transport_->PostWrite(*peer, {{0, 0, 4096}}, "n");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->Wait(DeadlineIn(absl::Seconds(1))).ok());
  const double live_s = live_sw.ElapsedSeconds();
  t.join();
  RecordProperty("silent_connect_ms", static_cast<int>(silent_s * 1000));
  RecordProperty("live_connect_and_write_ms", static_cast<int>(live_s * 1000));
  EXPECT_LT(live_s, 1.0);
  // The silent connect ended by its own deadline (an error, or OK if this UCX build needs no
  // answer to wire up), never much later.
  EXPECT_LT(silent_s, 3.5) << silent.status();
  ::kill(pid_, SIGCONT);
}

// Connecting to a peer on this host whose process has exited fails at once, naming it.
TEST_P(TwoProcessTest, ConnectToExitedPeerFailsAtOnce) {
  StartReceiver(Geometry{}, 64);
  SpawnPeer("receiver", 71);
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/send.addr.test", *transport_->LocalAddress()));
  ASSERT_TRUE(WaitForFile(dir_ + "/recv.ready", DeadlineIn(absl::Seconds(20))).ok())
      << PeerError();
  auto addr = WaitForFile(dir_ + "/recv.addr", DeadlineIn(absl::Seconds(1)));
  ASSERT_TRUE(addr.ok());
  KillPeer();
  Stopwatch sw;
  auto peer = transport_->Connect(*addr, DeadlineIn(absl::Seconds(5)));
  EXPECT_EQ(peer.status().code(), absl::StatusCode::kUnavailable) << peer.status();
  EXPECT_NE(peer.status().message().find("has exited"), std::string::npos) << peer.status();
  EXPECT_LT(sw.ElapsedSeconds(), 0.5);
}

// A peer with another model's layout is refused at connect, on both sides, naming both.
TEST_P(TwoProcessTest, FingerprintMismatchIsRefused) {
  StartReceiver(Geometry{}, 64);
  SpawnPeer("stream", 41, "other-model");
  auto err = WaitForFile(dir_ + "/send.err", DeadlineIn(absl::Seconds(20)));
  ASSERT_TRUE(err.ok());
  EXPECT_NE(err->find("KV layout mismatch"), std::string::npos) << *err;
  EXPECT_NE(err->find("test-sender"), std::string::npos) << *err;
  EXPECT_NE(err->find("test-receiver"), std::string::npos) << *err;
  EXPECT_NE(err->find("other-model"), std::string::npos) << *err;
  auto addr = WaitForFile(dir_ + "/send.addr", DeadlineIn(absl::Seconds(5)));
  ASSERT_TRUE(addr.ok());
  auto peer = transport_->Connect(*addr, DeadlineIn(absl::Seconds(5)));
  EXPECT_EQ(peer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(WaitPeer(DeadlineIn(absl::Seconds(10))), 2);
}

INSTANTIATE_TEST_SUITE_P(Ucx, TwoProcessTest, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace duet::transfer::testing
