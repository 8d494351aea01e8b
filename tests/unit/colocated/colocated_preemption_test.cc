// The colocated server preempts and resumes decodes as the decode node does: when
// its KV pool is too small for the decodes it runs, the newest running request gives its
// blocks back (its complete ones into the prefix cache), waits at the head of the queue and,
// once admitted again, computes its prompt and every token it generated and samples on. Every
// stream is exactly LocalEngine's (one process, a pool large enough): no token repeated,
// missing or different, indices in order, nothing failed, nothing left held.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "colocated/colocated_scheduler.h"
#include "tests/unit/colocated/colocated_test_rig.h"

namespace duet::colocated {
namespace {

class ColocatedServeTest : public ColocatedSchedulerTest {
 protected:
  // Three requests whose prompts fit the pool together (the headroom rule admits all three at
  // once) and whose decodes do not: 16 blocks of 4 tokens, each request grows to 7 (its prompt
  // of 8 and 20 tokens), so the newest is preempted and waits for the others to finish. Each
  // alone fits. Returns how many tokens each computed in chunks that were not decodes: more
  // than its prompt when it was preempted and resumed.
  std::map<std::string, int64_t> RunThreeThatOutgrowThePool(bool caching) {
    Start({.max_batch_tokens = 64, .max_running = 4, .enable_prefix_caching = caching},
          /*num_blocks=*/16);
    const std::vector<model::SamplingParams> params = {
        {.max_tokens = 20, .ignore_eos = true, .logprobs = 1},
        {.temperature = 0.8f,
         .seed = 7,
         .max_tokens = 20,
         .ignore_eos = true,
         .presence_penalty = 0.6f},
        {.temperature = 0.9f,
         .top_p = 0.9f,
         .seed = 9,
         .max_tokens = 20,
         .ignore_eos = true,
         .repetition_penalty = 1.2f,
         .min_tokens = 4}};
    // The scheduler's first step waits until all three are submitted, so that they are
    // admitted together whatever the machine's load (r0 first, r1 and r2 a step later).
    absl::Notification submitted;
    SetHook([&submitted](const StepInfo&) {
      submitted.WaitForNotificationWithTimeout(absl::Seconds(10));
    });
    std::vector<std::shared_ptr<ColocatedStream>> streams;
    for (int i = 0; i < 3; ++i) {
      streams.push_back(Submit(absl::StrCat("r", i), Prompt(8, 40 + i), params[i]));
    }
    submitted.Notify();
    for (int i = 0; i < 3; ++i) {
      Outcome o = Drain(*streams[i]);
      EXPECT_EQ(o.finish, FinishReason::kMaxTokens) << "r" << i << ": " << o.error;
      EXPECT_EQ(o.ids, Reference(Prompt(8, 40 + i), params[i])) << "r" << i;
      for (size_t k = 0; k < o.events.size(); ++k) {
        if (o.events[k].has_token) {
          EXPECT_EQ(o.events[k].index, static_cast<int>(k)) << "r" << i;
        }
      }
      EXPECT_TRUE(!o.events.empty() && o.events[0].prefilled) << "r" << i;
      // Into the batch at admission, out at each preemption and in again at its resume.
      std::vector<bool> want_running{true};
      for (int k = 0; !o.events.empty() && k < o.events.back().preemptions; ++k) {
        want_running.insert(want_running.end(), {false, true});
      }
      EXPECT_EQ(o.running, want_running) << "r" << i;
    }
    SetHook(nullptr);
    EXPECT_TRUE(AllFree());
    std::map<std::string, int64_t> prefilled;
    for (const StepInfo& s : Steps()) {
      for (size_t i = 0; i < s.request_ids.size(); ++i) {
        if (!s.is_decode[i]) prefilled[s.request_ids[i]] += s.tokens[i];
      }
    }
    return prefilled;
  }
};

// With the prefix cache: the preempted request's complete blocks are published and hit again
// when it resumes, so it computes little more than the block of its last tokens.
TEST_F(ColocatedServeTest, DecodesThePoolCannotGrowArePreemptedAndResumeTokenExact) {
  std::map<std::string, int64_t> prefilled = RunThreeThatOutgrowThePool(/*caching=*/true);
  EXPECT_EQ(prefilled["r0"], 8) << "the oldest is never preempted";
  EXPECT_GT(prefilled["r2"], 8) << "the newest was meant to be preempted and resumed";
  EXPECT_GT(sched_->PrefixCacheCounters().hit_tokens, 0) << "a resumed request hits its own blocks";
}

// Caching off: a preempted request's blocks are freed and it computes all its tokens again;
// the tokens are the same.
TEST_F(ColocatedServeTest, PreemptionWithoutAPrefixCacheRecomputesEverything) {
  std::map<std::string, int64_t> prefilled = RunThreeThatOutgrowThePool(/*caching=*/false);
  EXPECT_EQ(prefilled["r0"], 8);
  // Its prompt, then on resume its prompt again and every token it had generated (none when it
  // was preempted before its first decode step, which the machine's timing may decide).
  EXPECT_GE(prefilled["r2"], 8 + 8) << "its prompt and the tokens it generated, again";
  EXPECT_EQ(sched_->PrefixCacheCounters().hit_tokens, 0);
}

// A decode that cannot grow even alone (its prompt and max_tokens outgrow the whole pool) is
// not preempted for ever: it fails alone, naming the pool, and what it streamed stays exact.
TEST_F(ColocatedServeTest, ADecodeThatOutgrowsThePoolAloneFails) {
  Start({.max_batch_tokens = 64, .max_running = 4}, /*num_blocks=*/6);
  const model::SamplingParams p{.max_tokens = 40, .ignore_eos = true};
  Outcome o = Drain(*Submit("long", Prompt(8, 3), p));
  EXPECT_EQ(o.finish, FinishReason::kError);
  EXPECT_EQ(o.error.code(), absl::StatusCode::kResourceExhausted) << o.error;
  EXPECT_NE(o.error.message().find("cannot grow"), std::string::npos) << o.error;
  // 6 blocks hold 24 tokens: the prompt and 16 generated; the 17th, sampled from them, has no
  // room to be computed.
  EXPECT_EQ(o.ids.size(), 17u);
  const std::vector<int32_t> want = Reference(Prompt(8, 3), p);
  EXPECT_EQ(o.ids, std::vector<int32_t>(want.begin(), want.begin() + o.ids.size()));
  EXPECT_TRUE(AllFree());
}

}  // namespace
}  // namespace duet::colocated
