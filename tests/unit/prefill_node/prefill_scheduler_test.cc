// PrefillScheduler in one process: the inproc transport writes P's KV into a second BlockPool
// standing for the decode node's. The KV that lands is byte-exact what a one-process prefill
// writes, for single prompts, batches and chunked prompts; the first token equals
// LocalEngine::Generate's (a resumed request's at its sample step too); every layer's notice
// precedes the final one; batches respect the token budget; layer pipelining posts layer l
// before layer l+1 computes; refusals free every local block. When requests stop:
// prefill_scheduler_stop_test.cc.
#include "prefill_node/prefill_scheduler.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/base/clock.h"
#include "tests/unit/prefill_node/prefill_scheduler_rig.h"
#include "tests/unit/prefill_node/prefill_test_util.h"

namespace duet::prefill {
namespace {

TEST_F(PrefillSchedulerTest, SinglePromptLandsExactKvAndTheReferenceFirstToken) {
  Rig r({});
  Reference ref = Reference::Load(16);
  for (int n : {1, 15, 16, 17, 100}) {
    const std::vector<int32_t> prompt = Prompt(n, n, r.vocab());
    PrefillJob job = r.Job("req-" + std::to_string(n), 1000 + n, prompt);
    const std::vector<kv::BlockId> dest = job.remote_blocks;
    absl::StatusOr<PrefillResult> res = r.Run(std::move(job));
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ(res->first_token.id, ref.FirstToken(prompt)) << n << " tokens";
    EXPECT_EQ(res->chunks, 1);
    ASSERT_EQ(res->layer_done_unix_us.size(), 2u);
    ASSERT_EQ(res->layer_transfer_us.size(), 2u);
    EXPECT_LE(res->layer_done_unix_us[0], res->layer_done_unix_us[1]);
    EXPECT_GT(res->prefill_compute_us, 0);
    ref.ExpectKvEquals(prompt, *r.dpool, dest);
    r.DrainD();
    const v1::KvCompletion c = ExpectCompleteStream(r.got[1000 + n], r.layout.num_layers);
    EXPECT_EQ(c.first_token_id(), res->first_token.id);
    EXPECT_EQ(c.prompt_tokens(), n);
    EXPECT_EQ(c.layer_done_unix_us_size(), r.layout.num_layers);
    EXPECT_EQ(c.last_layer_done_unix_us(), res->layer_done_unix_us.back());
    ASSERT_TRUE(r.dpool->Free(dest).ok());
  }
  r.ExpectNoLeaks();
}

TEST_F(PrefillSchedulerTest, SampledFirstTokenAndLogprobsMatchTheReference) {
  Rig r({});
  Reference ref = Reference::Load(16);
  const std::vector<int32_t> prompt = Prompt(29, 3, r.vocab());
  model::SamplingParams p{
      .temperature = 0.8f, .top_p = 0.9f, .top_k = 40, .seed = 77, .logprobs = 3};
  PrefillJob job = r.Job("sampled", 7, prompt);
  job.sampling = p;
  auto res = r.Run(std::move(job));
  ASSERT_TRUE(res.ok()) << res.status();
  p.max_tokens = 1;
  auto g = ref.engine->Generate(prompt, p);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(res->first_token.id, g->generated_ids[0]);
  EXPECT_EQ(res->first_token.logprob, g->tokens[0].logprob);
  EXPECT_EQ(res->first_token.top_logprobs, g->tokens[0].top_logprobs);
  r.ExpectNoLeaks();
}

// A resumed request (its prompt ends with the sample_step tokens it already generated) samples
// the token one process draws at that step, with penalties, and its prompt is prefilled like any
// other: a last chunk of one token publishes the block it completes to P's cache.
TEST_F(PrefillSchedulerTest, ResumedRequestSamplesTheReferenceTokenAtItsStep) {
  Rig r(PrefillSchedulerOptions{.max_batch_tokens = 31});
  Reference ref = Reference::Load(16);
  const model::SamplingParams p{.temperature = 0.9f,
                                .seed = 5,
                                .max_tokens = 8,
                                .ignore_eos = true,
                                .logprobs = 2,
                                .repetition_penalty = 1.3f,
                                .presence_penalty = 0.6f,
                                .frequency_penalty = 0.5f};
  uint64_t tid = 8000;
  for (int step : {3, 7}) {
    const std::vector<int32_t> prompt = Prompt(32 - step, 60 + step, r.vocab());
    auto g = ref.engine->Generate(prompt, p);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_GT(g->generated_ids.size(), static_cast<size_t>(step));
    std::vector<int32_t> resumed = prompt;  // 32 tokens: chunks of 31 and 1
    resumed.insert(resumed.end(), g->generated_ids.begin(), g->generated_ids.begin() + step);
    PrefillJob job = r.Job("resumed-" + std::to_string(step), tid, resumed);
    job.sampling = p;
    job.sample_step = step;
    const std::vector<kv::BlockId> dest = job.remote_blocks;
    const int64_t published = r.sched->PrefixCacheCounters().published_blocks;
    absl::StatusOr<PrefillResult> res = r.Run(std::move(job));
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ(res->chunks, 2);
    EXPECT_EQ(res->first_token.id, g->generated_ids[step]) << "step " << step;
    EXPECT_EQ(res->first_token.logprob, g->tokens[step].logprob) << "step " << step;
    EXPECT_EQ(res->first_token.top_logprobs, g->tokens[step].top_logprobs) << "step " << step;
    EXPECT_EQ(r.sched->PrefixCacheCounters().published_blocks, published + 2)
        << "both blocks of the prompt, the second by its one-token chunk";
    ref.ExpectKvEquals(resumed, *r.dpool, dest);
    r.DrainD();
    ExpectCompleteStream(r.got[tid], r.layout.num_layers);
    ASSERT_TRUE(r.dpool->Free(dest).ok());
    ++tid;
  }
  r.ExpectNoLeaks();
}

// sampling.prompt_logprobs scores every prompt token after the first as one pass over the whole
// prompt does: in chunks, and when the prompt's prefix is in P's cache (the prompt is then
// computed whole). Without it the same prompt takes its prefix from the cache again.
TEST_F(PrefillSchedulerTest, PromptLogprobsScoreEveryTokenInChunksAndPastTheCache) {
  Rig r(PrefillSchedulerOptions{.max_batch_tokens = 48});
  Reference ref = Reference::Load(16);
  const std::vector<int32_t> prompt = Prompt(100, 9, r.vocab());
  const std::vector<Reference::Scored> want = ref.PromptLogprobs(prompt, 3);
  ASSERT_EQ(want.size(), 99u);
  for (int run = 0; run < 3; ++run) {
    const bool scored = run < 2;  // run 1 finds the prefix cached by run 0; run 2 takes it
    PrefillJob job = r.Job("scored-" + std::to_string(run), 9100 + run, prompt);
    if (scored) job.sampling.prompt_logprobs = 3;
    const std::vector<kv::BlockId> dest = job.remote_blocks;
    absl::StatusOr<PrefillResult> res = r.Run(std::move(job));
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ(res->chunks, scored ? 3 : 1) << run;  // 100 tokens in passes of 48; 4 uncached
    EXPECT_EQ(res->cached_tokens, scored ? 0 : 96) << run;
    EXPECT_EQ(res->first_token.id, ref.FirstToken(prompt)) << run;
    if (!scored) {
      EXPECT_TRUE(res->prompt_logprobs.empty());
    } else {
      ASSERT_EQ(res->prompt_logprobs.size(), want.size()) << run;
      for (size_t i = 0; i < want.size(); ++i) {
        const model::SampledToken& got = res->prompt_logprobs[i];
        EXPECT_EQ(got.id, prompt[i + 1]) << i;
        EXPECT_NEAR(got.logprob, want[i].logprob, 1e-5) << i;
        ASSERT_EQ(got.top_logprobs.size(), 3u) << i;
        for (int k = 0; k < 3; ++k) EXPECT_EQ(got.top_logprobs[k].first, want[i].top[k]) << i;
      }
    }
    ref.ExpectKvEquals(prompt, *r.dpool, dest);
    r.DrainD();
    ASSERT_TRUE(r.dpool->Free(dest).ok());
  }
  r.ExpectNoLeaks();
}

TEST_F(PrefillSchedulerTest, BatchesWaitingPromptsUnderTheBudgetAndChunksTheRest) {
  constexpr int64_t kBudget = 128;
  Gate gate;
  absl::Mutex mu;
  std::vector<BatchInfo> batches;
  PrefillSchedulerOptions opts{.max_batch_tokens = kBudget};
  opts.on_batch = [&](const BatchInfo& b) {
    absl::MutexLock lock(&mu);
    batches.push_back(b);
  };
  opts.on_layer_done = [&](int) { gate.Block(); };
  Rig r(std::move(opts));
  Reference ref = Reference::Load(16);

  const std::vector<int> lengths = {200, 5, 16, 33, 70};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<PrefillJob> jobs;
  for (size_t i = 0; i < lengths.size(); ++i) {
    prompts.push_back(Prompt(lengths[i], 40 + i, r.vocab()));
    jobs.push_back(r.Job("b" + std::to_string(i), 200 + i, prompts.back()));
  }
  std::vector<std::vector<kv::BlockId>> dests;
  for (const PrefillJob& j : jobs) dests.push_back(j.remote_blocks);
  std::vector<absl::StatusOr<PrefillResult>> results(lengths.size(), absl::UnknownError(""));
  std::vector<std::thread> threads;
  // The first prompt's first pass holds the scheduler until the others are all waiting.
  threads.emplace_back([&] { results[0] = r.Run(std::move(jobs[0])); });
  gate.AwaitReached();
  int64_t queued = lengths[0];
  for (size_t i = 1; i < lengths.size(); ++i) {  // queued in this order
    threads.emplace_back([&, i] { results[i] = r.Run(std::move(jobs[i])); });
    queued += lengths[i];
    AwaitQueuedTokens(*r.sched, queued);
  }
  EXPECT_EQ(r.sched->Load().queued_tokens, 200 + 5 + 16 + 33 + 70);
  EXPECT_EQ(r.sched->Load().running_requests, 5);
  gate.Open();
  for (auto& t : threads) t.join();

  for (size_t i = 0; i < lengths.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->first_token.id, ref.FirstToken(prompts[i])) << "prompt " << i;
    ref.ExpectKvEquals(prompts[i], *r.dpool, dests[i]);
  }
  EXPECT_EQ(results[0]->chunks, 2);  // 128 + 72
  EXPECT_EQ(results[4]->chunks, 2);  // 70 = 2 (after 72 + 5 + 16 + 33) + 68
  r.DrainD();
  for (size_t i = 0; i < lengths.size(); ++i) {
    const v1::KvCompletion c = ExpectCompleteStream(r.got[200 + i], r.layout.num_layers);
    EXPECT_EQ(c.first_token_id(), results[i]->first_token.id);
  }
  absl::MutexLock lock(&mu);
  size_t widest = 0;
  for (const BatchInfo& b : batches) {
    EXPECT_LE(b.tokens, kBudget);
    int64_t sum = 0;
    for (int64_t t : b.chunk_tokens) sum += t;
    EXPECT_EQ(sum, b.tokens);
    widest = std::max(widest, b.request_ids.size());
  }
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[1].request_ids, (std::vector<std::string>{"b0", "b1", "b2", "b3", "b4"}));
  EXPECT_EQ(batches[1].chunk_tokens, (std::vector<int64_t>{72, 5, 16, 33, 2}));
  EXPECT_EQ(widest, 5u);
  r.ExpectNoLeaks();
}

TEST_F(PrefillSchedulerTest, LongPromptIsPrefilledInChunksWithExactKv) {
  std::vector<BatchInfo> batches;
  PrefillSchedulerOptions opts{.max_batch_tokens = 64};
  opts.on_batch = [&](const BatchInfo& b) { batches.push_back(b); };
  Rig r(std::move(opts));
  Reference ref = Reference::Load(16);
  const std::vector<int32_t> prompt = Prompt(300, 9, r.vocab());
  PrefillJob job = r.Job("long", 55, prompt);
  const std::vector<kv::BlockId> dest = job.remote_blocks;
  auto res = r.Run(std::move(job));
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->chunks, 5);
  ASSERT_EQ(batches.size(), 5u);
  for (size_t i = 0; i < batches.size(); ++i) {
    EXPECT_EQ(batches[i].tokens, i < 4 ? 64 : 44);
    EXPECT_EQ(batches[i].final_chunk[0], i == 4);
  }
  EXPECT_EQ(res->first_token.id, ref.FirstToken(prompt));
  ref.ExpectKvEquals(prompt, *r.dpool, dest);
  r.DrainD();
  ExpectCompleteStream(r.got[55], r.layout.num_layers);
  r.ExpectNoLeaks();
}

// Prefix caching on P: a prompt that shares a prefix with an earlier one takes that prefix's
// full blocks from P's cache (never the block of its last token), computes only the rest, and
// still lands bit-exact KV and the reference first token on D (greedy and seeded). When D
// already holds leading blocks, only the blocks after them are sent.
TEST_F(PrefillSchedulerTest, CachedPrefixComputesOnlyTheRestWithExactKv) {
  std::vector<BatchInfo> batches;
  PrefillSchedulerOptions opts{.max_batch_tokens = 48};
  opts.on_batch = [&](const BatchInfo& b) { batches.push_back(b); };
  Rig r(std::move(opts));
  Reference ref = Reference::Load(16);
  uint64_t tid = 5000;
  int salt = 40;
  for (int shared_len : {15, 16, 40, 64, 100}) {
    const std::vector<int32_t> shared = Prompt(shared_len, salt++, r.vocab());
    for (int suffix : {0, 1, 7, 16, 33}) {
      std::vector<int32_t> prompt = shared;
      const std::vector<int32_t> tail = Prompt(suffix, salt++, r.vocab());
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      const int64_t n = static_cast<int64_t>(prompt.size());
      // The prefix is cached from the first prompt of each group on (the warm-up below).
      const bool warm = suffix == 0;
      const int64_t want_cached =
          warm ? 0 : std::min<int64_t>(shared_len / 16 * 16, (n - 1) / 16 * 16);
      for (int d_cached : {0, 1}) {
        if (d_cached * 16 > (n - 1) / 16 * 16) continue;
        PrefillJob job = r.Job("p" + std::to_string(tid), tid, prompt);
        model::SamplingParams sp;
        if (tid % 2) sp = {.temperature = 0.7f, .seed = tid};
        job.sampling = sp;
        // D says it holds its first d_cached blocks: give those back, keep the rest.
        const std::vector<kv::BlockId> all = job.remote_blocks;
        job.remote_cached_blocks = d_cached;
        job.remote_blocks.assign(all.begin() + d_cached, all.end());
        if (d_cached) {
          ASSERT_TRUE(r.dpool->Free({all[0]}).ok());
        }
        const std::vector<kv::BlockId> dest = job.remote_blocks;
        batches.clear();
        absl::StatusOr<PrefillResult> res = r.Run(std::move(job));
        ASSERT_TRUE(res.ok()) << res.status();
        // The second run of a prompt (d_cached 1) finds all of the first run's full blocks.
        const int64_t cached = d_cached == 1 ? (n - 1) / 16 * 16 : want_cached;
        EXPECT_EQ(res->cached_tokens, cached) << "prompt of " << n << ", prefix " << shared_len;
        int64_t computed = 0;
        for (const BatchInfo& b : batches) computed += b.tokens;
        EXPECT_EQ(computed, n - res->cached_tokens);
        EXPECT_EQ(res->first_token.id, ref.FirstToken(prompt, sp)) << "prompt of " << n;
        EXPECT_EQ(res->kv_bytes_sent, static_cast<int64_t>(dest.size()) * r.layout.num_layers *
                                          static_cast<int64_t>(r.layout.BlockBytes()));
        ref.ExpectKvEquals(prompt, *r.dpool, dest, d_cached);
        r.DrainD();
        ExpectCompleteStream(r.got[tid], r.layout.num_layers);
        ASSERT_TRUE(r.dpool->Free(dest).ok());
        ++tid;
      }
    }
  }
  EXPECT_GT(r.sched->PrefixCacheCounters().hit_tokens, 0);
  r.ExpectNoLeaks();
}

// A destination that claims to hold the block of the last prompt token, or whose block count
// does not add up, is refused before anything is computed.
TEST_F(PrefillSchedulerTest, RefusesADestinationWhoseCachedBlocksDoNotAddUp) {
  Rig r({});
  const std::vector<int32_t> prompt = Prompt(32, 1, r.vocab());
  PrefillJob job = r.Job("bad", 9, prompt);
  job.remote_cached_blocks = 2;  // both blocks: the last token's block must be sent
  job.remote_blocks.clear();
  absl::StatusOr<PrefillResult> res = r.Run(std::move(job));
  EXPECT_EQ(res.status().code(), absl::StatusCode::kInvalidArgument) << res.status();
  EXPECT_NE(res.status().message().find("at most 1 may be cached"), std::string::npos)
      << res.status();
  PrefillJob job2 = r.Job("bad2", 10, prompt);
  job2.remote_cached_blocks = 1;  // but still two blocks listed
  res = r.Run(std::move(job2));
  EXPECT_EQ(res.status().code(), absl::StatusCode::kInvalidArgument) << res.status();
  r.ExpectNoLeaks();
}

// With pipelining, layer l's notice has reached D when layer l is done computing (inproc
// writes are synchronous); without it, nothing reaches D before the pass ends.
TEST_F(PrefillSchedulerTest, LayerPipeliningPostsEachLayerFromTheHook) {
  for (bool pipelined : {true, false}) {
    SCOPED_TRACE(pipelined ? "pipelined" : "bulk");
    std::vector<int> landed_at_hook;
    Rig* rig = nullptr;
    PrefillSchedulerOptions opts{.no_layer_pipelining = !pipelined};
    opts.on_layer_done = [&](int layer) {
      rig->DrainD();
      landed_at_hook.push_back(static_cast<int>(rig->got[9].notices.size()));
    };
    Rig r(std::move(opts));
    rig = &r;
    Reference ref = Reference::Load(16);
    const std::vector<int32_t> prompt = Prompt(40, 1, r.vocab());
    PrefillJob job = r.Job("p", 9, prompt);
    const std::vector<kv::BlockId> dest = job.remote_blocks;
    auto res = r.Run(std::move(job));
    ASSERT_TRUE(res.ok()) << res.status();
    ASSERT_EQ(landed_at_hook.size(), 2u);
    if (pipelined) {
      EXPECT_EQ(landed_at_hook, (std::vector<int>{1, 2}));
    } else {
      EXPECT_EQ(landed_at_hook, (std::vector<int>{0, 0}));
    }
    EXPECT_EQ(res->first_token.id, ref.FirstToken(prompt));
    ref.ExpectKvEquals(prompt, *r.dpool, dest);
    r.DrainD();
    ExpectCompleteStream(r.got[9], r.layout.num_layers);
    r.ExpectNoLeaks();
  }
}

// Staging (the path a GPU pool takes), on the cpu: the transport exports only the host mirror,
// so what lands on D went through CopyKvToHost and PostStaged (the landing watcher); pipelined and
// bulk, single and chunked prompts, batched together: exact KV, the reference first token, every
// layer once and the final notice last, nothing left behind. The first token is handed out
// (kFirstToken) once sampled, before the KV has landed: once per request, without transfer timings,
// and equal to the token of the last event (kKvLanded).
TEST_F(PrefillSchedulerTest, FirstTokenIsHandedOutBeforeRunReturns) {
  for (bool pipelined : {true, false}) {
    SCOPED_TRACE(pipelined ? "pipelined" : "bulk");
    Rig r({.no_layer_pipelining = !pipelined});
    Reference ref = Reference::Load(16);
    const std::vector<int32_t> prompt = Prompt(40, 9, r.vocab());
    PrefillJob job = r.Job("first", 77, prompt);
    std::vector<PrefillResult> early;
    absl::StatusOr<PrefillResult> res =
        r.Run(std::move(job), [&](const PrefillResult& first) { early.push_back(first); });
    ASSERT_TRUE(res.ok()) << res.status();
    ASSERT_EQ(early.size(), 1u);
    EXPECT_EQ(early[0].first_token.id, ref.FirstToken(prompt));
    EXPECT_EQ(early[0].first_token.id, res->first_token.id);
    EXPECT_EQ(early[0].prefill_compute_us, res->prefill_compute_us);
    EXPECT_GT(early[0].prefill_compute_us, 0);
    EXPECT_EQ(early[0].layer_done_unix_us.size(), 2u);
    EXPECT_TRUE(early[0].layer_transfer_us.empty());
    EXPECT_EQ(res->layer_transfer_us.size(), 2u);
    r.DrainD();
    (void)ExpectCompleteStream(r.got[77], r.layout.num_layers);
    r.ExpectNoLeaks();
  }
}

TEST_F(PrefillSchedulerTest, StagedThroughAHostMirrorLandsExactKv) {
  for (bool pipelined : {true, false}) {
    SCOPED_TRACE(pipelined ? "pipelined" : "bulk");
    Rig r({.max_batch_tokens = 64, .no_layer_pipelining = !pipelined}, 256, 512, 16,
          /*staged=*/true);
    Reference ref = Reference::Load(16);
    const std::vector<int> lengths = {1, 17, 40, 150};  // 150 > budget: chunked
    std::vector<std::thread> callers;
    std::vector<absl::StatusOr<PrefillResult>> results(lengths.size());
    std::vector<std::vector<kv::BlockId>> dests(lengths.size());
    for (size_t i = 0; i < lengths.size(); ++i) {
      PrefillJob job =
          r.Job("s" + std::to_string(i), 500 + i, Prompt(lengths[i], int(i), r.vocab()));
      dests[i] = job.remote_blocks;
      callers.emplace_back([&r, &results, i, job = std::move(job)]() mutable {
        results[i] = r.Run(std::move(job));
      });
    }
    for (auto& t : callers) t.join();
    r.DrainD();
    for (size_t i = 0; i < lengths.size(); ++i) {
      const std::vector<int32_t> prompt = Prompt(lengths[i], int(i), r.vocab());
      ASSERT_TRUE(results[i].ok()) << lengths[i] << ": " << results[i].status();
      EXPECT_EQ(results[i]->first_token.id, ref.FirstToken(prompt)) << lengths[i] << " tokens";
      ref.ExpectKvEquals(prompt, *r.dpool, dests[i]);
      const v1::KvCompletion c = ExpectCompleteStream(r.got[500 + i], r.layout.num_layers);
      EXPECT_EQ(c.first_token_id(), results[i]->first_token.id);
    }
    r.ExpectNoLeaks();
  }
}

// P's pool holds one prompt at a time: the next waits for room (and says so in its load)
// instead of failing, then lands exact KV; one that runs out of time while waiting fails with
// DeadlineExceeded naming the pool; past max_waiting_for_room a prompt is refused at once.
// (The holder keeps its blocks while its landing watcher is held, the scheduler thread free.)
TEST_F(PrefillSchedulerTest, PromptWithoutRoomWaitsForItThenLandsExactKv) {
  Gate gate;
  PrefillSchedulerOptions opts;
  opts.on_landing = [&](const std::string&) { gate.Block(); };
  opts.max_waiting_for_room = 2;
  Rig r(std::move(opts), /*p_blocks=*/4);
  Reference ref = Reference::Load(16);
  const std::vector<int32_t> first = Prompt(60, 1, r.vocab()), second = Prompt(40, 2, r.vocab());
  absl::StatusOr<PrefillResult> r0 = absl::UnknownError(""), r1 = r0, r2 = r0, r3 = r0;
  std::thread t0([&] { r0 = r.Run(r.Job("holder", 1, first)); });
  gate.AwaitReached();  // holds all 4 blocks while its KV lands
  PrefillJob j1 = r.Job("waiter", 2, second);
  const std::vector<kv::BlockId> dest = j1.remote_blocks;
  std::thread t1([&] { r1 = r.Run(std::move(j1)); });
  std::thread t2(
      [&] { r2 = r.Run(r.Job("late", 3, Prompt(30, 3, r.vocab()), absl::Milliseconds(300))); });
  const absl::Time until = DeadlineIn(absl::Seconds(10));
  while (r.sched->Load().waiting_for_room < 2 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(r.sched->Load().waiting_for_room, 2);
  EXPECT_GE(r.sched->Load().queued_tokens, 70);
  // A third waiter is one too many.
  r3 = r.Run(r.Job("refused", 4, Prompt(20, 4, r.vocab())));
  EXPECT_TRUE(absl::IsResourceExhausted(r3.status())) << r3.status();
  EXPECT_NE(r3.status().message().find("max_waiting_for_room"), std::string::npos) << r3.status();
  t2.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(r2.status())) << r2.status();
  EXPECT_NE(r2.status().message().find("for room in the prefill node's KV pool"), std::string::npos)
      << r2.status();
  gate.Open();
  t0.join();
  t1.join();
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->first_token.id, ref.FirstToken(second));
  ref.ExpectKvEquals(second, *r.dpool, dest);
  r.DrainD();
  ExpectCompleteStream(r.got[2], r.layout.num_layers);
  EXPECT_EQ(r.sched->Load().waiting_for_room, 0);
  r.ExpectNoLeaks();
}

TEST_F(PrefillSchedulerTest, RefusesBadRequestsCleanly) {
  Rig r({}, /*p_blocks=*/4);
  const int vocab = r.vocab();
  auto run = [&](PrefillJob j) { return r.Run(std::move(j)).status(); };

  PrefillJob bad_token = r.Job("t", 1, Prompt(10, 1, vocab));
  bad_token.prompt[3] = vocab;
  EXPECT_TRUE(absl::IsInvalidArgument(run(bad_token)));

  PrefillJob too_long = r.Job("l", 2, Prompt(10, 1, vocab));
  too_long.prompt = Prompt(4096, 1, vocab);  // the context is 4096
  absl::Status s = run(too_long);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;

  PrefillJob few_blocks = r.Job("b", 3, Prompt(40, 1, vocab));
  few_blocks.remote_blocks.pop_back();
  s = run(few_blocks);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("needs 3"), std::string::npos) << s;

  PrefillJob empty = r.Job("e", 4, Prompt(1, 1, vocab));
  empty.prompt.clear();
  EXPECT_TRUE(absl::IsInvalidArgument(run(empty)));

  PrefillJob bad_sampling = r.Job("s", 5, Prompt(8, 1, vocab));
  bad_sampling.sampling.top_p = 2.f;
  EXPECT_TRUE(absl::IsInvalidArgument(run(bad_sampling)));

  // P's pool holds 4 blocks: a 5-block prompt can never fit, refused at once naming both.
  s = run(r.Job("big", 6, Prompt(80, 1, vocab)));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("can never fit: it needs 5 blocks"), std::string::npos) << s;
  EXPECT_NE(s.message().find("holds 4"), std::string::npos) << s;

  // A transfer id already streaming is refused by the sender; the request id check first.
  EXPECT_TRUE(
      r.sender->Begin({.request_id = 7, .peer = r.peer, .local_blocks = {0}, .remote_blocks = {0}})
          .ok());
  s = run(r.Job("dup-transfer", 7, Prompt(8, 1, vocab)));
  EXPECT_TRUE(absl::IsAlreadyExists(s)) << s;
  EXPECT_TRUE(r.sender->Abort(7, DeadlineIn(absl::Seconds(1))).ok());

  EXPECT_FALSE(PrefillScheduler::Create(r.runner.get(), r.ppool.get(), r.tp.get(), r.sender.get(),
                                        {.max_batch_tokens = 0})
                   .ok());
  r.ExpectNoLeaks();
}

}  // namespace
}  // namespace duet::prefill
