// The colocated scheduler's test rig: the tiny synthetic model, prompts, draining a stream, and
// the fixture (a scheduler over its own engine's runner and a pool of blocks of 4 tokens, its
// steps recorded, a hook on the scheduler thread, LocalEngine as the reference). Shared by
// colocated_scheduler_test.cc and colocated_preemption_test.cc.
//
//   class MyTest : public ColocatedSchedulerTest {};
//   TEST_F(MyTest, X) { Start({.max_batch_tokens = 32}); auto s = Submit("a", Prompt(5, 1), p);
//                       EXPECT_EQ(Drain(*s).ids, Reference(Prompt(5, 1), p)); }
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "colocated/colocated_scheduler.h"
#include "common/base/clock.h"
#include "common/engine/local_engine.h"
#include "common/model/synthetic_model.h"

namespace duet::colocated {

inline const std::string& TinyModelDir() {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    auto* d = new std::string(
        absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/duet_colocated_tiny_", getpid()));
    if (!model::WriteSyntheticModel("tiny", /*seed=*/5, *d).ok()) std::abort();
    return d;
  }();
  return *dir;
}

inline std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 29 + salt * 13 + 5) % 256;
  return p;
}

struct Outcome {
  std::vector<int32_t> ids;
  std::vector<ColocatedEvent> events;  // but the batch entries and exits:
  std::vector<bool> running;           // each ColocatedEvent::running, in order
  FinishReason finish = FinishReason::kNone;
  absl::Status error;
};

inline Outcome Drain(ColocatedStream& stream, absl::Duration timeout = absl::Seconds(60)) {
  Outcome o;
  const absl::Time deadline = absl::Now() + timeout;
  while (o.finish == FinishReason::kNone && absl::Now() < deadline) {
    for (ColocatedEvent& e : stream.Pop(std::min(deadline, DeadlineIn(absl::Milliseconds(50))))) {
      if (e.running) {
        o.running.push_back(*e.running);
        continue;
      }
      if (e.has_token) o.ids.push_back(e.token.id);
      if (e.finished()) {
        o.finish = e.finish;
        o.error = e.error;
      }
      o.events.push_back(std::move(e));
    }
  }
  return o;
}

// Pops `stream` until it has a token (true) or the timeout passes.
inline bool AwaitToken(ColocatedStream& stream, absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    for (const ColocatedEvent& e : stream.Pop(deadline)) {
      if (e.has_token) return true;
    }
  }
  return false;
}

class ColocatedSchedulerTest : public ::testing::Test {
 protected:
  // A scheduler over its own engine's runner and a pool of `num_blocks` blocks of 4 tokens.
  void Start(ColocatedSchedulerOptions options, int64_t num_blocks = 512) {
    auto e = model::LocalEngine::Load(
        TinyModelDir(),
        {.device = compute::Device::kCpu, .num_threads = 1, .block_size = 4, .kv_cache_bytes = 1});
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    auto pool = kv::BlockPool::Create(engine_->runner().MakeKvLayout(4), num_blocks);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    options.on_step = [this](const StepInfo& s) {
      std::function<void(const StepInfo&)> hook;
      {
        absl::MutexLock lock(&mu_);
        steps_.push_back(s);
        hook = hook_;
      }
      if (hook) hook(s);
    };
    auto s = ColocatedScheduler::Create(std::move(options), &engine_->runner(), pool_.get());
    ASSERT_TRUE(s.ok()) << s.status();
    sched_ = std::move(*s);
  }
  void TearDown() override {
    if (sched_) sched_->Shutdown();
  }

  std::vector<int32_t> Reference(const std::vector<int32_t>& prompt,
                                 const model::SamplingParams& params) {
    if (!ref_) {
      auto e = model::LocalEngine::Load(TinyModelDir(), {.device = compute::Device::kCpu,
                                                         .num_threads = 1,
                                                         .block_size = 4,
                                                         .kv_cache_bytes = 16 << 20});
      EXPECT_TRUE(e.ok()) << e.status();
      ref_ = std::move(*e);
    }
    auto r = ref_->Generate(prompt, params);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->generated_ids : std::vector<int32_t>();
  }
  std::shared_ptr<ColocatedStream> Submit(const std::string& id, std::vector<int32_t> prompt,
                                          model::SamplingParams params,
                                          absl::Time deadline = absl::InfiniteFuture()) {
    auto s = sched_->Submit({.request_id = id,
                             .prompt = std::move(prompt),
                             .sampling = std::move(params),
                             .deadline = deadline});
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : nullptr;
  }
  bool AllFree() const {
    const kv::BlockPoolStats s = pool_->Stats();
    return s.available() == s.total && s.used == 0 && s.quarantined == 0;
  }
  // Runs on the scheduler thread before each step's forward pass.
  void SetHook(std::function<void(const StepInfo&)> hook) {
    absl::MutexLock lock(&mu_);
    hook_ = std::move(hook);
  }
  // Submits `id` from the scheduler thread at the first step in which a request decodes, and
  // returns its stream once it is submitted. `start` (which submits the request that will
  // decode) runs after the hook is in place, so that a slow test thread cannot miss the first
  // decode step (the hook used to be set after the first request was already running).
  std::shared_ptr<ColocatedStream> SubmitWhenDecoding(const std::string& id,
                                                      std::vector<int32_t> prompt,
                                                      model::SamplingParams params,
                                                      const std::function<void()>& start) {
    auto stream = std::make_shared<std::shared_ptr<ColocatedStream>>();
    auto submitted = std::make_shared<std::atomic<bool>>(false);
    SetHook([=, this](const StepInfo& s) {
      if (s.decode_tokens == 0 || submitted->load()) return;
      *stream = Submit(id, prompt, params);
      submitted->store(true);
    });
    start();
    const absl::Time deadline = DeadlineIn(absl::Seconds(30));
    while (!submitted->load() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    return *stream;
  }
  void SlowSteps(absl::Duration d) {
    SetHook([d](const StepInfo&) { absl::SleepFor(d); });
  }
  std::vector<StepInfo> Steps() {
    absl::MutexLock lock(&mu_);
    return steps_;
  }

  std::unique_ptr<model::LocalEngine> engine_;
  std::unique_ptr<kv::BlockPool> pool_;
  std::unique_ptr<ColocatedScheduler> sched_;
  std::unique_ptr<model::LocalEngine> ref_;
  absl::Mutex mu_;
  std::vector<StepInfo> steps_ ABSL_GUARDED_BY(mu_);
  std::function<void(const StepInfo&)> hook_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet::colocated
