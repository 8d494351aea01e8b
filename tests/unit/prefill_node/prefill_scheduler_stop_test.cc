// PrefillScheduler when requests stop: cancel, deadline, a lost decode peer, shutdown and a
// mix of them under load free every local block and abort the stream; a pass whose requests
// all stopped is abandoned at the next layer, and a stopped request costs at most the rest of
// one chunk.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/base/clock.h"
#include "prefill_node/prefill_scheduler.h"
#include "tests/unit/prefill_node/prefill_scheduler_rig.h"

namespace duet::prefill {
namespace {

class PrefillSchedulerStopTest : public PrefillSchedulerTest {};

// A staged request cancelled while queued, and one whose deadline passes, free everything too.
TEST_F(PrefillSchedulerStopTest, StagedCancelAndDeadlineFreeEverything) {
  Gate gate;
  PrefillSchedulerOptions opts;
  opts.on_batch = [&](const BatchInfo&) { gate.Block(); };
  Rig r(std::move(opts), 256, 512, 16, /*staged=*/true);
  std::thread first([&] { (void)r.Run(r.Job("blocker", 600, Prompt(30, 1, r.vocab()))); });
  gate.AwaitReached();
  absl::StatusOr<PrefillResult> cancelled, late;
  std::thread a([&] { cancelled = r.Run(r.Job("c", 601, Prompt(20, 2, r.vocab()))); });
  std::thread b(
      [&] { late = r.Run(r.Job("d", 602, Prompt(20, 3, r.vocab()), absl::Milliseconds(50))); });
  AwaitRunning(*r.sched, 3);
  EXPECT_TRUE(r.sched->Cancel("c"));
  absl::SleepFor(absl::Milliseconds(100));
  gate.Open();
  first.join();
  a.join();
  b.join();
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled) << cancelled.status();
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  r.ExpectNoLeaks();
}

TEST_F(PrefillSchedulerStopTest, CancelAndDeadlineWhileQueuedAbortAndFree) {
  Gate gate;
  PrefillSchedulerOptions opts;
  opts.on_batch = [&](const BatchInfo&) { gate.Block(); };
  Rig r(std::move(opts));
  absl::StatusOr<PrefillResult> r0 = absl::UnknownError(""), r1 = r0, r2 = r0;
  std::thread t0([&] { r0 = r.Run(r.Job("blocker", 1, Prompt(20, 1, r.vocab()))); });
  gate.AwaitReached();
  std::thread t1([&] { r1 = r.Run(r.Job("cancel-me", 2, Prompt(50, 2, r.vocab()))); });
  std::thread t2(
      [&] { r2 = r.Run(r.Job("late", 3, Prompt(30, 3, r.vocab()), absl::Milliseconds(150))); });
  AwaitRunning(*r.sched, 3);
  EXPECT_TRUE(r.sched->Cancel("cancel-me"));
  EXPECT_FALSE(r.sched->Cancel("no-such-request"));
  // The scheduler thread acts on both once out of the blocker's pass: after late's deadline.
  absl::SleepFor(absl::Milliseconds(200));
  gate.Open();
  t1.join();
  t2.join();
  EXPECT_TRUE(absl::IsCancelled(r1.status())) << r1.status();
  EXPECT_TRUE(absl::IsDeadlineExceeded(r2.status())) << r2.status();
  t0.join();
  EXPECT_TRUE(r0.ok()) << r0.status();
  r.DrainD();
  for (uint64_t tid : {2, 3}) {
    ASSERT_EQ(r.got[tid].notices.size(), 1u) << tid;
    EXPECT_TRUE(r.got[tid].HasAborted()) << tid;
  }
  ExpectCompleteStream(r.got[1], r.layout.num_layers);
  r.ExpectNoLeaks();
}

TEST_F(PrefillSchedulerStopTest, CancelDuringThePassAbortsAndTheNextRequestStillWorks) {
  PrefillScheduler* sched = nullptr;
  std::atomic<bool> cancel_armed{true};
  PrefillSchedulerOptions opts;
  opts.on_layer_done = [&](int layer) {
    if (layer == 0 && cancel_armed.exchange(false)) {
      EXPECT_TRUE(sched->Cancel("mid"));
    }
  };
  Rig r(std::move(opts));
  sched = r.sched.get();
  auto res = r.Run(r.Job("mid", 5, Prompt(64, 5, r.vocab())));
  EXPECT_TRUE(absl::IsCancelled(res.status())) << res.status();
  r.DrainD();
  EXPECT_TRUE(r.got[5].HasAborted());
  EXPECT_FALSE(r.got[5].HasFinal());
  r.ExpectNoLeaks();

  r.ExpectServesExactly("after", 6, Prompt(64, 6, r.vocab()));
}

// A request stopped in the middle of a pass that serves nobody else costs no more layers: the
// pass is abandoned after the layer it was stopped in, and no later chunk runs.
TEST_F(PrefillSchedulerStopTest, StoppedAloneThePassIsAbandonedAtTheNextLayer) {
  for (const bool by_deadline : {false, true}) {
    SCOPED_TRACE(by_deadline ? "deadline" : "cancel");
    PrefillScheduler* sched = nullptr;
    std::atomic<int> passes{0};
    std::atomic<bool> stopped{false};
    std::atomic<int> layers_after_stop{0};
    PrefillSchedulerOptions opts{.max_batch_tokens = 64};
    opts.on_batch = [&](const BatchInfo&) { ++passes; };
    opts.on_layer_done = [&](int layer) {
      if (stopped) ++layers_after_stop;
      if (passes == 2 && layer == 0 && !stopped.exchange(true)) {
        if (by_deadline) {
          absl::SleepFor(absl::Milliseconds(400));  // the deadline passes in this layer
        } else {
          EXPECT_TRUE(sched->Cancel("long"));
        }
      }
    };
    Rig r(std::move(opts));
    sched = r.sched.get();
    const absl::Time t0 = absl::Now();
    auto res = r.Run(r.Job("long", 11, Prompt(256, 11, r.vocab()),
                           by_deadline ? absl::Milliseconds(300) : absl::Seconds(30)));
    if (by_deadline) {
      ASSERT_GE(absl::Now() - t0, absl::Milliseconds(300));
      EXPECT_TRUE(absl::IsDeadlineExceeded(res.status())) << res.status();
    } else {
      EXPECT_TRUE(absl::IsCancelled(res.status())) << res.status();
    }
    EXPECT_EQ(passes.load(), 2) << "a chunk ran after the request stopped";
    EXPECT_EQ(layers_after_stop.load(), 0) << "layers ran after the request stopped";
    const PrefillStopCounters c = r.sched->StopCounters();
    EXPECT_EQ(c.passes_abandoned, 1);
    EXPECT_EQ(c.stopped_in_pass, 1);
    EXPECT_GT(c.compute_after_stop_us, 0);
    r.DrainD();
    EXPECT_FALSE(r.got[11].HasFinal());
    r.ExpectNoLeaks();

    // The pool and the model are fine: the same prompt, run again, is exact.
    r.ExpectServesExactly("again", 12, Prompt(256, 11, r.vocab()));
  }
}

// A request cancelled in a pass it shares with another rides to the end of that pass (at most
// one chunk) and gets no later one; the other request is unaffected.
TEST_F(PrefillSchedulerStopTest, CancelledInASharedPassCostsAtMostTheRestOfThatChunk) {
  PrefillScheduler* sched = nullptr;
  Gate gate;
  std::mutex mu;
  std::vector<BatchInfo> batches;
  std::atomic<bool> armed{false};
  PrefillSchedulerOptions opts{.max_batch_tokens = 64};
  opts.on_batch = [&](const BatchInfo& b) {
    {
      std::lock_guard<std::mutex> l(mu);
      batches.push_back(b);
    }
    gate.Block();  // the first pass waits until both requests are queued
  };
  opts.on_layer_done = [&](int layer) {
    std::lock_guard<std::mutex> l(mu);
    if (layer == 0 && batches.size() == 2 && !armed.exchange(true)) {
      EXPECT_TRUE(sched->Cancel("gone"));
    }
  };
  Rig r(std::move(opts));
  sched = r.sched.get();
  Reference ref = Reference::Load(16);
  // Pass 1: kept[0, 64); pass 2: kept[64, 100) and gone[0, 28), cancelled there.
  const std::vector<int32_t> keep_prompt = Prompt(100, 21, r.vocab());
  absl::StatusOr<PrefillResult> gone = absl::UnknownError(""), kept = gone;
  PrefillJob job = r.Job("kept", 22, keep_prompt);
  const std::vector<kv::BlockId> dest = job.remote_blocks;
  std::thread b([&] { kept = r.Run(std::move(job)); });
  gate.AwaitReached();
  std::thread a([&] { gone = r.Run(r.Job("gone", 21, Prompt(320, 20, r.vocab()))); });
  AwaitRunning(*r.sched, 2);
  gate.Open();
  a.join();
  b.join();
  EXPECT_TRUE(absl::IsCancelled(gone.status())) << gone.status();
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->first_token.id, ref.FirstToken(keep_prompt));
  r.DrainD();
  ref.ExpectKvEquals(keep_prompt, *r.dpool, dest);
  // "gone" was in pass 2 (cancelled there) and in none after.
  int with_gone = 0;
  {
    std::lock_guard<std::mutex> l(mu);
    for (size_t i = 0; i < batches.size(); ++i) {
      for (const std::string& id : batches[i].request_ids) {
        if (id == "gone") {
          ++with_gone;
          EXPECT_EQ(i, 1u) << "pass " << i << " computed the cancelled request";
        }
      }
    }
  }
  EXPECT_EQ(with_gone, 1);
  EXPECT_EQ(r.sched->StopCounters().passes_abandoned, 0);  // the pass served "kept" too
  r.ExpectNoLeaks();
}

TEST_F(PrefillSchedulerStopTest, LostDecodePeerEndsRequestsWithUnavailableNamingIt) {
  Gate gate;
  PrefillSchedulerOptions opts;
  opts.on_batch = [&](const BatchInfo&) { gate.Block(); };
  Rig r(std::move(opts));
  absl::StatusOr<PrefillResult> r0 = absl::UnknownError(""), r1 = r0;
  std::thread t0([&] { r0 = r.Run(r.Job("first", 1, Prompt(20, 1, r.vocab()))); });
  gate.AwaitReached();
  std::thread t1([&] { r1 = r.Run(r.Job("second", 2, Prompt(20, 2, r.vocab()))); });
  AwaitRunning(*r.sched, 2);
  const absl::Time lost = absl::Now();
  r.td.reset();  // the decode node dies
  gate.Open();   // the scheduler thread acts on it once out of the pass
  t1.join();
  EXPECT_LT(absl::Now() - lost, absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(r1.status())) << r1.status();
  EXPECT_NE(r1.status().message().find(kPeerName), std::string::npos) << r1.status();
  t0.join();
  EXPECT_TRUE(absl::IsUnavailable(r0.status())) << r0.status();
  EXPECT_NE(r0.status().message().find(kPeerName), std::string::npos) << r0.status();
  r.ExpectNoLeaks();
}

TEST_F(PrefillSchedulerStopTest, DuplicateRequestIdIsRefusedAndShutdownFailsWaitingRequests) {
  Gate gate;
  PrefillSchedulerOptions opts;
  opts.on_batch = [&](const BatchInfo&) { gate.Block(); };
  Rig r(std::move(opts));
  absl::StatusOr<PrefillResult> r0 = absl::UnknownError(""), r1 = r0;
  std::thread t0([&] { r0 = r.Run(r.Job("same", 1, Prompt(20, 1, r.vocab()))); });
  gate.AwaitReached();
  absl::Status dup = r.Run(r.Job("same", 2, Prompt(20, 2, r.vocab()))).status();
  EXPECT_TRUE(absl::IsAlreadyExists(dup)) << dup;
  std::thread t1([&] { r1 = r.Run(r.Job("queued", 3, Prompt(20, 3, r.vocab()))); });
  AwaitRunning(*r.sched, 2);
  std::thread stopper([&] { r.sched->Shutdown(); });
  t1.join();
  EXPECT_TRUE(absl::IsUnavailable(r1.status())) << r1.status();
  gate.Open();
  t0.join();
  stopper.join();
  EXPECT_FALSE(r0.ok());
  EXPECT_TRUE(absl::IsUnavailable(r.Run(r.Job("after", 4, Prompt(5, 1, r.vocab()))).status()));
  r.ExpectNoLeaks();
}

// Many concurrent requests of mixed lengths under a small budget, a third cancelled at
// arbitrary moments and some with deadlines too short to make it: the rest produce the
// reference first token, D sees for each either a complete stream or an abort, and every
// block of P's pool is free at the end.
TEST_F(PrefillSchedulerStopTest, MixedOutcomesUnderLoadLeakNothing) {
  Rig r({.max_batch_tokens = 64});
  Reference ref = Reference::Load(16);
  constexpr int kRequests = 24;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<PrefillJob> jobs;
  for (int i = 0; i < kRequests; ++i) {
    prompts.push_back(Prompt(1 + (i * 37) % 150, 60 + i, r.vocab()));
    jobs.push_back(r.Job("m" + std::to_string(i), 300 + i, prompts.back(),
                         i % 8 == 7 ? absl::Milliseconds(5) : absl::Seconds(30)));
  }
  std::vector<absl::StatusOr<PrefillResult>> results(kRequests, absl::UnknownError(""));
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] { results[i] = r.Run(std::move(jobs[i])); });
  }
  std::thread canceller([&] {
    for (int i = 0; i < kRequests; i += 3) {
      absl::SleepFor(absl::Microseconds(300 * i));
      r.sched->Cancel("m" + std::to_string(i));
    }
  });
  for (auto& t : threads) t.join();
  canceller.join();
  r.DrainD();
  int ok = 0;
  for (int i = 0; i < kRequests; ++i) {
    SCOPED_TRACE(i);
    const Received& got = r.got[300 + i];
    if (results[i].ok()) {
      ++ok;
      EXPECT_EQ(results[i]->first_token.id, ref.FirstToken(prompts[i]));
      ExpectCompleteStream(got, r.layout.num_layers);
    } else {
      const absl::Status& s = results[i].status();
      EXPECT_TRUE(absl::IsCancelled(s) || absl::IsDeadlineExceeded(s)) << s;
      EXPECT_TRUE(i % 3 == 0 || i % 8 == 7) << s;
      // Refused before admission: nothing was begun, so D has nothing to hear (the
      // coordinator releases its reservation on the error).
      const bool refused = s.message().find("before admission") != std::string::npos;
      EXPECT_TRUE(refused ? got.notices.empty() : (got.HasAborted() || got.HasFinal())) << s;
    }
  }
  EXPECT_GE(ok, kRequests / 2);
  r.ExpectNoLeaks();
}

}  // namespace
}  // namespace duet::prefill
