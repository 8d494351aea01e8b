// The prefill scheduler's test rig: P (runner, pool, sender, scheduler) and D (a pool and an
// inproc transport) in one process, RunToEnd (submit a job, read its stream to the last event),
// a gate that holds the thread that calls it (the scheduler thread in a pass, or a request's
// landing watcher), and the fixture. Shared by the prefill_scheduler*_test.cc files.
//
//   Rig r({.max_batch_tokens = 64});
//   auto res = r.Run(r.Job("id", /*tid=*/1, Prompt(64, 1, r.vocab())));
//   r.ExpectNoLeaks();
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
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

// Submits `job` and reads its stream to the last event: the result once the KV landed, or the
// request's error. `on_first_token` gets the kFirstToken event's result. Waits at most 30 s past
// the job's deadline (the scheduler ends a request at its deadline).
inline absl::StatusOr<PrefillResult> RunToEnd(
    PrefillScheduler& sched, PrefillJob job,
    const std::function<void(const PrefillResult&)>& on_first_token = nullptr) {
  const absl::Time limit = std::min(job.deadline, DeadlineIn(absl::Minutes(5))) + absl::Seconds(30);
  absl::StatusOr<std::shared_ptr<PrefillStream>> stream = sched.Submit(std::move(job));
  if (!stream.ok()) return stream.status();
  while (true) {
    std::vector<PrefillEvent> events = (*stream)->Pop(limit);
    if (events.empty()) return absl::InternalError("the stream did not end 30 s past the deadline");
    for (PrefillEvent& ev : events) {
      switch (ev.kind) {
        case PrefillEventKind::kScheduled:
          break;
        case PrefillEventKind::kFirstToken:
          if (on_first_token) on_first_token(ev.result);
          break;
        case PrefillEventKind::kKvLanded:
          return std::move(ev.result);
        case PrefillEventKind::kFailed:
          return ev.status;
      }
    }
  }
}

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
  // While true, P's writes neither land nor end, through Cancel too, until their endpoint is
  // closed (as on a black-holed tcp link).
  std::shared_ptr<std::atomic<bool>> black_hole = std::make_shared<std::atomic<bool>>(false);
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
    backend = *compute::CreateBackend(compute::Device::kCpu, {.num_threads = 2});
    runner = *model::ModelRunner::Create(*config, std::move(*weights), backend.get());
    layout = runner->MakeKvLayout(block_size);
    ppool = *kv::BlockPool::Create(layout, p_blocks);
    dpool = *kv::BlockPool::Create(layout, d_blocks);
    tp = *transfer::CreateTransport(
        "inproc", {.name = "prefill-test", .layout = layout, .inproc_black_hole = black_hole});
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

  absl::StatusOr<PrefillResult> Run(
      PrefillJob job, const std::function<void(const PrefillResult&)>& on_first_token = nullptr) {
    return RunToEnd(*sched, std::move(job), on_first_token);
  }

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
    auto ok = Run(std::move(job));
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_EQ(ok->first_token.id, ref.FirstToken(prompt));
    ref.ExpectKvEquals(prompt, *dpool, dest);
    ExpectNoLeaks();
  }
};

// Blocks the first thread that calls Block() (from an observer: the scheduler thread in a pass,
// or a request's landing watcher) until Open().
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
