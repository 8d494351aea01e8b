// The prefill scheduler's test rig: P (runner, pool, sender, scheduler) and D (a pool and an
// inproc transport) in one process, a gate that holds the scheduler thread in a pass, and the
// fixture. Shared by prefill_scheduler_test.cc and prefill_scheduler_stop_test.cc.
//
//   Rig r({.max_batch_tokens = 64});
//   auto res = r.sched->Run(r.Job("id", /*tid=*/1, Prompt(64, 1, r.vocab())));
//   r.ExpectNoLeaks();
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/base/clock.h"
#include "common/compute/compute_backend.h"
#include "common/config/model_config.h"
#include "common/weights/weights.h"
#include "prefill_node/prefill_scheduler.h"
#include "tests/unit/prefill_node/prefill_test_util.h"

namespace duet::prefill {

using testing::Drain;
using testing::ExpectCompleteStream;
using testing::Prompt;
using testing::Received;
using testing::Reference;
using testing::TinyModelDir;

constexpr char kPeerName[] = "decode-test";

// P (runner, pool, sender, scheduler) and D (a pool and an inproc transport) in one process.
struct Rig {
  std::unique_ptr<compute::ComputeBackend> backend;
  std::unique_ptr<model::ModelRunner> runner;
  kv::KvLayout layout;
  std::unique_ptr<kv::BlockPool> ppool;
  std::unique_ptr<kv::BlockPool> dpool;
  std::unique_ptr<transfer::Transport> tp;
  std::unique_ptr<transfer::Transport> td;
  std::unique_ptr<compute::KvMemory> pmirror;  // staged rigs: what tp exports
  std::unique_ptr<transfer::MemoryRegion> pregion;
  std::unique_ptr<transfer::MemoryRegion> dregion;
  transfer::PeerId peer = 0;
  std::unique_ptr<transfer::KvStreamSender> sender;
  std::unique_ptr<PrefillScheduler> sched;
  std::map<uint64_t, Received> got;

  // staged: P's transport exports a host mirror of its pool (as a prefill node with a GPU pool
  // does), so D only gets what the scheduler staged into the mirror.
  explicit Rig(PrefillSchedulerOptions opts, int64_t p_blocks = 256, int64_t d_blocks = 512,
               int block_size = 16, bool staged = false) {
    auto config = model::ModelConfig::FromJsonFile(TinyModelDir() + "/config.json");
    EXPECT_TRUE(config.ok()) << config.status();
    auto weights = model::LoadWeights(TinyModelDir(), *config);
    EXPECT_TRUE(weights.ok()) << weights.status();
    backend = *compute::CreateBackend("cpu", {.num_threads = 2});
    runner = *model::ModelRunner::Create(*config, std::move(*weights), backend.get());
    layout = runner->MakeKvLayout(block_size);
    ppool = *kv::BlockPool::Create(layout, p_blocks);
    dpool = *kv::BlockPool::Create(layout, d_blocks);
    tp = *transfer::CreateTransport("inproc", {.name = "prefill-test", .layout = layout});
    td = *transfer::CreateTransport("inproc", {.name = kPeerName, .layout = layout});
    if (staged) {
      pmirror = *backend->AllocateHostMirror(ppool->region_bytes());
      opts.host_mirror = kv::KvCacheView{layout, pmirror->data(), p_blocks};
      pregion = *tp->Register(pmirror->data(), ppool->region_bytes());
    } else {
      pregion = *tp->Register(ppool->region(), ppool->region_bytes());
    }
    dregion = *td->Register(dpool->region(), dpool->region_bytes());
    peer = *tp->Connect(*td->LocalAddress(), DeadlineIn(absl::Seconds(5)));
    sender = *transfer::KvStreamSender::Create(tp.get(), layout, p_blocks);
    auto s = PrefillScheduler::Create(runner.get(), ppool.get(), tp.get(), sender.get(),
                                      std::move(opts));
    EXPECT_TRUE(s.ok()) << s.status();
    sched = std::move(*s);
  }
  ~Rig() { sched.reset(); }

  // What the coordinator would send: D's blocks reserved for the prompt.
  PrefillJob Job(const std::string& id, uint64_t tid, std::vector<int32_t> prompt,
                 absl::Duration timeout = absl::Seconds(30)) {
    PrefillJob j;
    j.request_id = id;
    j.transfer_id = tid;
    j.remote_blocks = *dpool->Allocate(layout.BlocksForTokens(prompt.size()));
    j.prompt = std::move(prompt);
    j.peer = peer;
    j.peer_name = kPeerName;
    j.deadline = DeadlineIn(timeout);
    return j;
  }
  void DrainD() {
    if (td) Drain(*td, got);
  }
  void ExpectNoLeaks() {
    const kv::BlockPoolStats s = ppool->Stats();
    EXPECT_EQ(s.available(), s.total)
        << "P's blocks leaked: " << s.used << " used, " << s.quarantined << " quarantined";
    EXPECT_EQ(sender->active_requests(), 0);
    EXPECT_EQ(sched->Load().running_requests, 0);
    EXPECT_EQ(sched->Load().queued_tokens, 0);
  }
  int vocab() const { return runner->config().vocab_size; }
  // Runs `prompt` to the end: the first token and D's K/V are exactly the reference's, and
  // nothing leaks.
  void ExpectServesExactly(const std::string& id, uint64_t tid,
                           const std::vector<int32_t>& prompt) {
    Reference ref = Reference::Load(16);
    PrefillJob job = Job(id, tid, prompt);
    const std::vector<kv::BlockId> dest = job.remote_blocks;
    auto ok = sched->Run(std::move(job));
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_EQ(ok->first_token.id, ref.FirstToken(prompt));
    ref.ExpectKvEquals(prompt, *dpool, dest);
    ExpectNoLeaks();
  }
};

// Blocks the scheduler thread in its first pass until Open().
struct Gate {
  std::atomic<bool> reached{false};
  absl::Notification open;
  std::atomic<bool> used{false};
  void Block() {
    if (used.exchange(true)) return;
    reached = true;
    open.WaitForNotificationWithTimeout(absl::Seconds(20));
  }
  void AwaitReached() {
    const absl::Time deadline = DeadlineIn(absl::Seconds(10));
    while (!reached && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_TRUE(reached.load());
  }
  void Open() {
    if (!open.HasBeenNotified()) open.Notify();
  }
};

inline void AwaitRunning(PrefillScheduler& s, int n) {
  const absl::Time deadline = DeadlineIn(absl::Seconds(10));
  while (s.Load().running_requests < n && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(s.Load().running_requests, n);
}

inline void AwaitQueuedTokens(PrefillScheduler& s, int64_t n) {
  const absl::Time deadline = DeadlineIn(absl::Seconds(10));
  while (s.Load().queued_tokens < n && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(s.Load().queued_tokens, n);
}

class PrefillSchedulerTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() { testing::RemoveTinyModel(); }
};

}  // namespace duet::prefill
