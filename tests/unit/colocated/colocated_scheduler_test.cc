// ColocatedScheduler: token-exact against LocalEngine::Generate, steps that mix decodes and
// prefill chunks under the token budget (decodes first), cancel in every phase frees the
// blocks, a full pool makes admission wait (or refuses cleanly), deadlines, bad input.
#include "colocated/colocated_scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/engine/local_engine.h"
#include "common/sampling/sampling.h"
#include "tests/unit/colocated/colocated_test_rig.h"

namespace duet::colocated {
namespace {

// Invariant 1: concurrent greedy and seeded requests of lengths across block and chunk
// boundaries produce LocalEngine::Generate's tokens, whatever shares their steps.
TEST_F(ColocatedSchedulerTest, TokenExactAgainstLocalEngine) {
  Start({.max_batch_tokens = 32, .max_running = 8});
  const std::vector<int> lengths = {1, 3, 4, 5, 17, 40, 100, 250, 33, 64};
  std::vector<std::shared_ptr<ColocatedStream>> streams;
  std::vector<model::SamplingParams> params;
  for (size_t i = 0; i < lengths.size(); ++i) {
    model::SamplingParams p{.max_tokens = 10, .ignore_eos = true, .logprobs = 2};
    if (i % 2) {
      p.temperature = 0.9f;
      p.top_p = 0.9f;
      p.seed = 77 + i;
    }
    params.push_back(p);
    streams.push_back(Submit(absl::StrCat("r", i), Prompt(lengths[i], i), p));
  }
  for (size_t i = 0; i < lengths.size(); ++i) {
    ASSERT_NE(streams[i], nullptr);
    Outcome o = Drain(*streams[i]);
    EXPECT_EQ(o.finish, FinishReason::kMaxTokens) << o.error;
    EXPECT_EQ(o.ids, Reference(Prompt(lengths[i], i), params[i])) << "length " << lengths[i];
    ASSERT_FALSE(o.events.empty());
    EXPECT_TRUE(o.events[0].prefilled);
    EXPECT_GE(o.events[0].prefill_chunks, (lengths[i] + 31) / 32);
    for (size_t k = 0; k < o.events.size(); ++k) {
      EXPECT_EQ(o.events[k].index, static_cast<int>(k));
      EXPECT_EQ(o.events[k].token.top_logprobs.size(), 2u);
    }
    EXPECT_TRUE(o.events[1].joined_decode);
  }
  EXPECT_TRUE(AllFree());
  for (const StepInfo& s : Steps()) EXPECT_LE(s.decode_tokens + s.prefill_tokens, 32);
}

// A long prompt arriving while another request decodes is prefilled in chunks that share each
// step with the decode: decodes first, the chunk fills the rest of the budget.
TEST_F(ColocatedSchedulerTest, MixesPrefillChunksWithRunningDecodes) {
  constexpr int64_t kBudget = 16;
  Start({.max_batch_tokens = kBudget, .max_running = 4});
  const model::SamplingParams pa{.max_tokens = 200, .ignore_eos = true};
  const model::SamplingParams pb{.max_tokens = 5, .ignore_eos = true};
  std::shared_ptr<ColocatedStream> a;
  auto b = SubmitWhenDecoding("b", Prompt(100, 2), pb, [&] { a = Submit("a", Prompt(3, 1), pa); });
  ASSERT_NE(b, nullptr);
  Outcome ob = Drain(*b);
  Outcome oa = Drain(*a);
  EXPECT_EQ(oa.ids, Reference(Prompt(3, 1), pa));
  EXPECT_EQ(ob.ids, Reference(Prompt(100, 2), pb));

  int mixed = 0;
  int64_t b_prefilled = 0;
  for (const StepInfo& s : Steps()) {
    EXPECT_LE(s.decode_tokens + s.prefill_tokens, kBudget);
    bool seen_prefill = false;
    for (size_t i = 0; i < s.request_ids.size(); ++i) {
      if (!s.is_decode[i]) seen_prefill = true;
      EXPECT_FALSE(s.is_decode[i] && seen_prefill) << "a decode after a prefill chunk";
      if (s.request_ids[i] == "b" && !s.is_decode[i]) {
        b_prefilled += s.tokens[i];
        if (!s.final_chunk[i]) {
          // A non-final chunk takes all the budget the decodes left.
          EXPECT_EQ(s.tokens[i] + s.decode_tokens, kBudget);
        }
      }
    }
    if (s.decode_tokens > 0 && s.prefill_tokens > 0) ++mixed;
  }
  EXPECT_EQ(b_prefilled, 100);
  EXPECT_GE(mixed, 100 / kBudget) << "b's chunks should have run alongside a's decodes";
  ASSERT_FALSE(ob.events.empty());
  EXPECT_GE(ob.events[0].prefill_chunks, 100 / kBudget);
  EXPECT_GT(ob.events[0].prefill_compute_us, 0);
  EXPECT_TRUE(AllFree());
}

// Cancel while waiting for room, while prefilling and while decoding: each stream ends with
// kCancelled and every block is free again.
TEST_F(ColocatedSchedulerTest, CancelInEveryPhaseFreesBlocks) {
  Start({.max_batch_tokens = 8, .max_running = 2}, /*num_blocks=*/80);
  const model::SamplingParams lng{.max_tokens = 2000, .ignore_eos = true};
  // When the long prompt's first chunk is about to run, "decoding" decodes in the same step and
  // "waiting" waits for a batch slot: cancel all three there, on the scheduler thread.
  std::atomic<int> cancels{0};
  std::atomic<bool> all_submitted{false};
  SetHook([&](const StepInfo& s) {
    absl::SleepFor(absl::Milliseconds(2));
    for (size_t i = 0; i < s.request_ids.size(); ++i) {
      if (s.request_ids[i] == "prefilling" && !s.final_chunk[i] && all_submitted.load() &&
          cancels.load() == 0) {
        EXPECT_GT(pool_->Stats().used, 0);
        cancels += sched_->Cancel("waiting");
        cancels += sched_->Cancel("prefilling");
        cancels += sched_->Cancel("decoding");
      }
    }
  });
  auto dec = Submit("decoding", Prompt(5, 1), lng);
  ASSERT_TRUE(AwaitToken(*dec));                                  // it decodes
  auto pre = Submit("prefilling", Prompt(240, 2), lng);           // chunks of 7 tokens
  auto wait = Submit("waiting", Prompt(10, 3), lng);              // max_running is 2
  all_submitted = true;
  EXPECT_FALSE(sched_->Cancel("never-submitted"));
  Outcome ow = Drain(*wait, absl::Seconds(30));
  Outcome op = Drain(*pre, absl::Seconds(30));
  Outcome od = Drain(*dec, absl::Seconds(30));
  EXPECT_EQ(cancels.load(), 3);
  for (const Outcome* o : {&ow, &op, &od}) EXPECT_EQ(o->finish, FinishReason::kCancelled);
  EXPECT_TRUE(ow.ids.empty());
  EXPECT_TRUE(op.ids.empty()) << "cancelled before its prompt was prefilled";
  EXPECT_TRUE(AllFree()) << pool_->Stats().used;
  EXPECT_FALSE(sched_->Cancel("decoding")) << "a finished request is gone";
  // The thread refreshes the counts after its step.
  ColocatedLoad load = sched_->Load();
  for (const absl::Time end = DeadlineIn(absl::Seconds(5));
       load.running_requests + load.waiting_requests > 0 && absl::Now() < end;
       load = sched_->Load()) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(load.running_requests + load.waiting_requests, 0);
  EXPECT_EQ(load.free_blocks, load.total_blocks);
  for (const StepInfo& s : Steps()) {
    for (const std::string& id : s.request_ids) EXPECT_NE(id, "waiting");
  }
}

// With the pool full, a new request waits (FIFO) until blocks come back, then runs exactly.
TEST_F(ColocatedSchedulerTest, FullPoolMakesAdmissionWait) {
  // 12 blocks of 4 tokens: "a" takes 8 for its prompt and grows to 10; "b" needs 5 + headroom.
  Start({.max_batch_tokens = 64, .max_running = 4}, /*num_blocks=*/12);
  const model::SamplingParams pa{.max_tokens = 8, .ignore_eos = true};
  const model::SamplingParams pb{.max_tokens = 4, .ignore_eos = true};
  auto a = Submit("a", Prompt(30, 1), pa);
  auto b = Submit("b", Prompt(20, 2), pb);
  Outcome oa = Drain(*a);
  Outcome ob = Drain(*b);
  EXPECT_EQ(oa.ids, Reference(Prompt(30, 1), pa));
  EXPECT_EQ(ob.ids, Reference(Prompt(20, 2), pb));
  // "b" ran only once "a" was gone.
  bool a_done = false;
  for (const StepInfo& s : Steps()) {
    bool has_a = false, has_b = false;
    for (const std::string& id : s.request_ids) {
      has_a = has_a || id == "a";
      has_b = has_b || id == "b";
    }
    EXPECT_FALSE(has_a && has_b);
    if (has_b) a_done = true;
    EXPECT_FALSE(a_done && has_a);
  }
  EXPECT_TRUE(a_done);
  EXPECT_TRUE(AllFree());
}

// A decode the pool cannot grow takes the blocks of the request still prefilling, which starts
// over once there is room again; both produce the reference tokens.
TEST_F(ColocatedSchedulerTest, GrowingDecodePreemptsAPrefill) {
  // 16 blocks of 4 tokens. "a" ends at 59 tokens (15 blocks). "b" (40 tokens, 10 blocks) is
  // admitted early but, with a budget of 2, prefills one token per step while "a" grows.
  Start({.max_batch_tokens = 2, .max_running = 2}, /*num_blocks=*/16);
  const model::SamplingParams pa{.max_tokens = 56, .ignore_eos = true};
  const model::SamplingParams pb{.max_tokens = 4, .ignore_eos = true};
  std::shared_ptr<ColocatedStream> a;
  auto b = SubmitWhenDecoding("b", Prompt(40, 2), pb, [&] { a = Submit("a", Prompt(4, 1), pa); });
  ASSERT_NE(b, nullptr);
  Outcome oa = Drain(*a);
  Outcome ob = Drain(*b);
  EXPECT_EQ(oa.finish, FinishReason::kMaxTokens) << oa.error;
  EXPECT_EQ(ob.finish, FinishReason::kMaxTokens) << ob.error;
  EXPECT_EQ(oa.ids, Reference(Prompt(4, 1), pa));
  EXPECT_EQ(ob.ids, Reference(Prompt(40, 2), pb));
  int64_t b_prefilled = 0;
  for (const StepInfo& s : Steps()) {
    for (size_t i = 0; i < s.request_ids.size(); ++i) {
      if (s.request_ids[i] == "b" && !s.is_decode[i]) b_prefilled += s.tokens[i];
    }
  }
  EXPECT_GT(b_prefilled, 40) << "b should have been preempted and prefilled again";
  EXPECT_TRUE(AllFree());
}

// A prompt the whole pool cannot hold is refused at once; one that never finds room within the
// admission timeout is refused then; nothing is left held.
TEST_F(ColocatedSchedulerTest, FullPoolRefusesCleanly) {
  Start({.max_batch_tokens = 64, .max_running = 4, .admission_timeout = absl::Milliseconds(300)},
        /*num_blocks=*/40);
  SlowSteps(absl::Milliseconds(10));
  auto too_big = sched_->Submit(
      {.request_id = "huge", .prompt = Prompt(200, 1), .sampling = {.max_tokens = 1}});
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted) << too_big.status();
  EXPECT_NE(too_big.status().message().find("needs 51 KV blocks"), std::string::npos)
      << too_big.status();
  // "hog" holds 25 of 40 blocks (and grows by one every 4 steps of 10 ms); "late" needs 20.
  auto hog = Submit("hog", Prompt(100, 2), {.max_tokens = 4000, .ignore_eos = true});
  ASSERT_TRUE(AwaitToken(*hog));
  auto late = Submit("late", Prompt(80, 3), {.max_tokens = 2});
  Outcome o = Drain(*late, absl::Seconds(30));
  EXPECT_EQ(o.finish, FinishReason::kError);
  EXPECT_EQ(o.error.code(), absl::StatusCode::kResourceExhausted) << o.error;
  EXPECT_TRUE(sched_->Cancel("hog"));
  EXPECT_EQ(Drain(*hog).finish, FinishReason::kCancelled);
  EXPECT_TRUE(AllFree());
}

TEST_F(ColocatedSchedulerTest, DeadlineEndsTheRequestAndFreesBlocks) {
  Start({.max_batch_tokens = 64, .max_running = 4});
  SlowSteps(absl::Milliseconds(5));
  auto s = Submit("slow", Prompt(10, 1), {.max_tokens = 4000, .ignore_eos = true},
                  DeadlineIn(absl::Milliseconds(300)));
  Outcome o = Drain(*s, absl::Seconds(30));
  EXPECT_EQ(o.finish, FinishReason::kError);
  EXPECT_EQ(o.error.code(), absl::StatusCode::kDeadlineExceeded) << o.error;
  EXPECT_LT(o.ids.size(), 4000u);
  EXPECT_TRUE(AllFree());
}

TEST_F(ColocatedSchedulerTest, RefusesBadInput) {
  Start({.max_batch_tokens = 64, .max_running = 4});
  SlowSteps(absl::Milliseconds(5));
  auto code = [&](std::vector<int32_t> prompt, model::SamplingParams p) {
    return sched_->Submit({.request_id = "x", .prompt = std::move(prompt), .sampling = p})
        .status()
        .code();
  };
  EXPECT_EQ(code({}, {}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1, 320}, {}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1, -1}, {}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Prompt(4096, 0), {}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1}, {.temperature = -1.f}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1}, {.max_tokens = 0}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1}, {.stop_token_ids = {999}}), absl::StatusCode::kInvalidArgument);
  auto dup = Submit("dup", {1, 2}, {.max_tokens = 3000, .ignore_eos = true});
  EXPECT_EQ(code({1}, {}), absl::StatusCode::kOk) << "x is free again";
  EXPECT_EQ(sched_->Submit({.request_id = "dup", .prompt = {1}}).status().code(),
            absl::StatusCode::kAlreadyExists);
  sched_->Shutdown();
  EXPECT_EQ(Drain(*dup).error.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sched_->Submit({.request_id = "after", .prompt = {1}}).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(AllFree());
}

TEST(ColocatedSchedulerCreateTest, RefusesABudgetBelowTheBatch) {
  auto e = model::LocalEngine::Load(TinyModelDir(), {.device = compute::Device::kCpu,
                                                     .num_threads = 1,
                                                     .block_size = 4,
                                                     .kv_cache_bytes = 1 << 20});
  ASSERT_TRUE(e.ok()) << e.status();
  auto s = ColocatedScheduler::Create({.max_batch_tokens = 8, .max_running = 16}, &(*e)->runner(),
                                      &(*e)->pool());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("max_running"), std::string::npos) << s.status();
}

namespace prefix {

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

int64_t CachedOf(const Outcome& o) {
  for (const ColocatedEvent& e : o.events) {
    if (e.prefilled) return e.cached_tokens;
  }
  return -1;
}

}  // namespace prefix

// Prefix caching: requests that share a prefix (of lengths across block boundaries, with
// suffixes of every length, greedy and seeded, alone and batched with others, chunked) take
// its full blocks from the cache, never the block of the last prompt token, and still produce
// exactly LocalEngine::Generate's tokens. The generated tokens' blocks are cached too.
TEST_F(ColocatedSchedulerTest, PrefixCacheHitsAreTokenExact) {
  using prefix::CachedOf;
  using prefix::Concat;
  Start({.max_batch_tokens = 24, .max_running = 8});
  const std::vector<int> prefix_lengths = {3, 4, 7, 8, 13, 16, 33};
  const std::vector<int> suffix_lengths = {0, 1, 2, 5, 11};
  int salt = 100;
  for (int plen : prefix_lengths) {
    const std::vector<int32_t> shared = Prompt(plen, salt++);
    // Warm the cache with the prefix plus a suffix of its own.
    const std::vector<int32_t> first = Concat(shared, Prompt(3, salt++));
    model::SamplingParams greedy{.max_tokens = 4, .ignore_eos = true};
    Outcome warm = Drain(*Submit(absl::StrCat("warm", plen), first, greedy));
    ASSERT_EQ(warm.finish, FinishReason::kMaxTokens) << warm.error;
    EXPECT_EQ(CachedOf(warm), 0);
    // Then several requests at once that share the prefix, mixed with an unrelated one.
    std::vector<std::vector<int32_t>> prompts;
    std::vector<model::SamplingParams> params;
    std::vector<std::shared_ptr<ColocatedStream>> streams;
    for (size_t k = 0; k < suffix_lengths.size(); ++k) {
      std::vector<int32_t> p = Concat(shared, Prompt(suffix_lengths[k], salt++));
      if (p.empty()) continue;
      model::SamplingParams sp{.max_tokens = 6, .ignore_eos = true, .logprobs = 1};
      if (k % 2) {
        sp.temperature = 0.8f;
        sp.seed = 5 + k;
      }
      prompts.push_back(p);
      params.push_back(sp);
      streams.push_back(Submit(absl::StrCat("p", plen, "-", k), p, sp));
    }
    prompts.push_back(Prompt(29, salt++));
    params.push_back(greedy);
    streams.push_back(Submit(absl::StrCat("other", plen), prompts.back(), greedy));
    for (size_t k = 0; k < streams.size(); ++k) {
      ASSERT_NE(streams[k], nullptr);
      Outcome o = Drain(*streams[k]);
      ASSERT_EQ(o.finish, FinishReason::kMaxTokens) << o.error;
      EXPECT_EQ(o.ids, Reference(prompts[k], params[k]))
          << "prefix " << plen << ", prompt of " << prompts[k].size();
      const int64_t n = static_cast<int64_t>(prompts[k].size());
      const int64_t shared_full = k + 1 == streams.size() ? 0 : plen / 4 * 4;
      EXPECT_EQ(CachedOf(o), std::min(shared_full, (n - 1) / 4 * 4))
          << "prefix " << plen << ", prompt of " << n;
    }
  }
  // An identical prompt again: everything but the block of its last token.
  const std::vector<int32_t> same = Prompt(21, 7);
  model::SamplingParams greedy{.max_tokens = 5, .ignore_eos = true};
  Outcome a = Drain(*Submit("same-a", same, greedy));
  Outcome b = Drain(*Submit("same-b", same, greedy));
  EXPECT_EQ(CachedOf(a), 0);
  EXPECT_EQ(CachedOf(b), 20);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(b.ids, Reference(same, greedy));
  // The next turn of a chat: prompt + all but the last generated token are cached.
  std::vector<int32_t> turn2 = Concat(same, a.ids);
  turn2 = Concat(turn2, Prompt(6, 9));
  Outcome c = Drain(*Submit("turn2", turn2, greedy));
  EXPECT_EQ(CachedOf(c), (21 + 5 - 1) / 4 * 4);
  EXPECT_EQ(c.ids, Reference(turn2, greedy));
  EXPECT_GT(sched_->PrefixCacheCounters().hit_tokens, 0);
  EXPECT_TRUE(AllFree());
}

// sampling.prompt_logprobs: the first token's event scores every prompt token after the first,
// in chunks and with the prompt's prefix cached (it is computed whole then), as one pass over
// the whole prompt does; tokens stay exact. Without it, the prefix comes from the cache.
// As on the decode node, a request that ends early (cancelled mid-decode) leaves the K/V of its
// generated tokens in the prefix cache too: a prompt that continues its conversation takes
// those blocks from there, exactly.
TEST_F(ColocatedSchedulerTest, ACancelledRequestsGeneratedBlocksStayInThePrefixCache) {
  using prefix::CachedOf;
  using prefix::Concat;
  Start({.max_batch_tokens = 64, .max_running = 4});
  const std::vector<int32_t> prompt = Prompt(21, 7);  // 5 full blocks of 4, and one token
  auto s = Submit("cancel-me", prompt, {.max_tokens = 2000, .ignore_eos = true});
  std::vector<int32_t> generated;
  for (const absl::Time end = DeadlineIn(absl::Seconds(30));
       generated.size() < 8 && absl::Now() < end;) {
    for (const ColocatedEvent& e : s->Pop(DeadlineIn(absl::Milliseconds(50)))) {
      if (e.has_token) generated.push_back(e.token.id);
    }
  }
  ASSERT_GE(generated.size(), 8u);
  EXPECT_TRUE(sched_->Cancel("cancel-me"));
  Outcome cancelled = Drain(*s, absl::Seconds(30));
  EXPECT_EQ(cancelled.finish, FinishReason::kCancelled);
  EXPECT_TRUE(AllFree());
  // The first 8 tokens it generated: positions 21-28, whose K/V (but the last's) is in blocks
  // 5-6 (positions 20-27), complete.
  const std::vector<int32_t> next = Concat(
      Concat(prompt, std::vector<int32_t>(generated.begin(), generated.begin() + 8)), Prompt(3, 8));
  const model::SamplingParams greedy{.max_tokens = 5, .ignore_eos = true};
  Outcome again = Drain(*Submit("next-turn", next, greedy));
  ASSERT_EQ(again.finish, FinishReason::kMaxTokens) << again.error;
  EXPECT_EQ(CachedOf(again), 28) << "the cancelled request's generated blocks were not cached";
  EXPECT_EQ(again.ids, Reference(next, greedy));
}

TEST_F(ColocatedSchedulerTest, PromptLogprobsScoreTheWholePromptInChunks) {
  Start({.max_batch_tokens = 8, .max_running = 4});
  const std::vector<int32_t> prompt = Prompt(30, 61);
  model::SamplingParams greedy{.max_tokens = 3, .ignore_eos = true};
  const std::vector<int32_t> want_ids = Reference(prompt, greedy);  // also loads ref_
  kv::BlockTable table(&ref_->pool());
  ASSERT_TRUE(table.Reserve(static_cast<int64_t>(prompt.size())).ok());
  std::vector<model::SequenceInput> b = {
      {.seq_id = 1, .tokens = prompt, .start_pos = 0, .table = &table, .all_logits = true}};
  auto rows = ref_->runner().Forward(absl::MakeSpan(b), ref_->pool().View());
  ASSERT_TRUE(rows.ok()) << rows.status();
  std::vector<model::SampledToken> runs[2];
  for (int run = 0; run < 3; ++run) {
    model::SamplingParams sp = greedy;
    if (run < 2) sp.prompt_logprobs = 2;
    Outcome o = Drain(*Submit(absl::StrCat("scored", run), prompt, sp));
    ASSERT_EQ(o.finish, FinishReason::kMaxTokens) << o.error;
    EXPECT_EQ(o.ids, want_ids) << run;
    ASSERT_FALSE(o.events.empty());
    const ColocatedEvent& first = o.events.front();
    ASSERT_TRUE(first.prefilled);
    EXPECT_EQ(first.cached_tokens, run < 2 ? 0 : 28) << run;
    if (run == 2) {
      EXPECT_TRUE(first.prompt_logprobs.empty());
      continue;
    }
    runs[run] = first.prompt_logprobs;
    ASSERT_EQ(runs[run].size(), prompt.size() - 1) << run;
    for (size_t i = 0; i + 1 < prompt.size(); ++i) {
      const model::SampledToken want =
          compute::ScoreRowOnHost(rows->Row(i), rows->vocab, prompt[i + 1], 2);
      EXPECT_EQ(runs[run][i].id, prompt[i + 1]);
      EXPECT_EQ(runs[run][i].logprob, want.logprob) << i;  // the rows are bitwise the same
      EXPECT_EQ(runs[run][i].top_logprobs, want.top_logprobs) << i;
    }
  }
  EXPECT_TRUE(AllFree());
}

// Caching off: nothing is looked up or kept, and the tokens are the same.
TEST_F(ColocatedSchedulerTest, PrefixCachingOffTakesNothingFromTheCache) {
  Start({.max_batch_tokens = 24, .max_running = 8, .enable_prefix_caching = false});
  const std::vector<int32_t> p = Prompt(30, 3);
  model::SamplingParams greedy{.max_tokens = 4, .ignore_eos = true};
  Outcome a = Drain(*Submit("a", p, greedy));
  Outcome b = Drain(*Submit("b", p, greedy));
  EXPECT_EQ(prefix::CachedOf(b), 0);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(pool_->Stats().cached, 0);
  EXPECT_TRUE(AllFree());
}

// A pool too small to keep every prefix: cached blocks are evicted for new requests (never
// while a running request holds them), and every block ends free or evictable.
TEST_F(ColocatedSchedulerTest, EvictionUnderAFullPoolKeepsTokensExactAndLeaksNothing) {
  Start({.max_batch_tokens = 32, .max_running = 4}, /*num_blocks=*/24);
  model::SamplingParams greedy{.max_tokens = 3, .ignore_eos = true};
  const std::vector<int32_t> shared = Prompt(16, 40);
  for (int round = 0; round < 3; ++round) {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::shared_ptr<ColocatedStream>> streams;
    for (int k = 0; k < 4; ++k) {
      std::vector<int32_t> p = k % 2 ? prefix::Concat(shared, Prompt(9 + k, 50 + round * 4 + k))
                                     : Prompt(30, 60 + round * 4 + k);
      prompts.push_back(p);
      streams.push_back(Submit(absl::StrCat("r", round, "-", k), p, greedy));
    }
    for (size_t k = 0; k < streams.size(); ++k) {
      Outcome o = Drain(*streams[k]);
      ASSERT_EQ(o.finish, FinishReason::kMaxTokens) << o.error;
      EXPECT_EQ(o.ids, Reference(prompts[k], greedy)) << "round " << round << " request " << k;
    }
  }
  EXPECT_GT(pool_->Stats().evictions, 0);
  EXPECT_TRUE(AllFree());
}

}  // namespace
}  // namespace duet::colocated
