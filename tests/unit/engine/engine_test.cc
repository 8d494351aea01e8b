// The engine core every scheduler runs on, tested once here: the StepRunner (chunked prefill and
// decode equal to LocalEngine::Generate, one row mapping for mixed batches, the stop rule,
// refused items, a table without room changes nothing, a resumed prompt prefilled and sampled
// at its step) and KvCacheManager's side of a sequence's life (growth, preemption of the
// newest, publish or not at the end, cancel frees, a preempted sequence resumed token-exact).
// Role tests (prefill node, decode node, colocated server) keep only what their role adds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/engine/local_engine.h"
#include "common/engine/sequence.h"
#include "common/engine/step_runner.h"
#include "common/kv/block_pool.h"
#include "common/kv/kv_cache_manager.h"
#include "common/model/synthetic_model.h"

namespace duet::engine {
namespace {

constexpr int kBlockSize = 4;

// The tiny synthetic model (its context cut to `max_positions` when > 0), written once per
// process and setting.
const std::string& TinyModelDir(int max_positions = 0) {
  static std::map<int, std::string>* dirs = new std::map<int, std::string>();
  auto [it, fresh] = dirs->try_emplace(max_positions);
  if (fresh) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    it->second = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/duet_engine_tiny_", getpid(), "_",
                              max_positions);
    model::SyntheticOverrides o;
    if (max_positions > 0) o.max_position_embeddings = max_positions;
    if (!model::WriteSyntheticModel("tiny", /*seed=*/5, it->second, o).ok()) std::abort();
  }
  return it->second;
}

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 31 + salt * 17 + 3) % 256;
  return p;
}

std::unique_ptr<model::LocalEngine> LoadEngine(int max_positions = 0, int64_t kv_bytes = 16 << 20) {
  auto e = model::LocalEngine::Load(TinyModelDir(max_positions), {.device = compute::Device::kCpu,
                                                                  .num_threads = 1,
                                                                  .block_size = kBlockSize,
                                                                  .kv_cache_bytes = kv_bytes});
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// A core over the engine's runner, with a pool of its own: a manager and a step runner.
class EngineCoreTest : public ::testing::Test {
 protected:
  void Start(int64_t num_blocks, bool caching = true, int max_positions = 0) {
    engine_ = LoadEngine(max_positions);
    ASSERT_NE(engine_, nullptr);
    auto pool = kv::BlockPool::Create(engine_->runner().MakeKvLayout(kBlockSize), num_blocks);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    kv_ = std::make_unique<kv::KvCacheManager>(
        pool_.get(), engine_->runner().PrefixCacheSeed(kBlockSize), caching);
    step_ = std::make_unique<StepRunner>(&engine_->runner(), kv_.get(), engine_->eos_ids());
  }

  // A new sequence with blocks for all its tokens (none when the pool has no room).
  Sequence Admit(int64_t id, std::vector<int32_t> tokens, const model::SamplingParams& params,
                 int generated_before = 0) {
    Sequence seq(id, std::move(tokens), generated_before, params, engine_->eos_ids());
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    auto blocks = kv_->AllocateSequence(seq.tokens, n, !seq.ScoresPrompt());
    EXPECT_TRUE(blocks.ok()) << blocks.status();
    if (blocks.ok()) {
      seq.cached_tokens = blocks->cached_tokens;
      seq.table = std::move(*blocks).MakeTable(pool_.get());
    }
    return seq;
  }

  // Runs `seq` alone to its stop: its pending tokens in chunks of `chunk`, then decodes.
  model::StopReason RunToStop(Sequence& seq, int64_t chunk) {
    while (true) {
      if (seq.decoding()) {
        absl::Status grown = kv_->Grow(*seq.table, seq.computed() + 1);
        EXPECT_TRUE(grown.ok()) << grown;
        if (!grown.ok()) return model::StopReason::kNone;
      }
      const int64_t n = std::min(chunk, seq.pending());
      StepItem item{.seq = &seq, .tokens = n};
      auto out = step_->Run({&item, 1});
      EXPECT_TRUE(out.ok()) << out.status();
      if (!out.ok()) return model::StopReason::kNone;
      if ((*out)[0].sampled && (*out)[0].stop != model::StopReason::kNone) return (*out)[0].stop;
    }
  }

  std::vector<int32_t> Output(const Sequence& seq) const {
    return std::vector<int32_t>(seq.tokens.begin() + seq.prompt_len, seq.tokens.end());
  }
  std::vector<int32_t> Reference(const std::vector<int32_t>& prompt,
                                 const model::SamplingParams& params) {
    auto r = engine_->Generate(prompt, params);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->generated_ids : std::vector<int32_t>();
  }
  bool AllFree() const {
    const kv::BlockPoolStats s = pool_->Stats();
    return s.available() == s.total && s.used == 0;
  }

  std::unique_ptr<model::LocalEngine> engine_;  // the runner, and the reference
  std::unique_ptr<kv::BlockPool> pool_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<StepRunner> step_;
};

// Invariant 1 on the core: a prompt prefilled in chunks of every size, then decoded, gives
// LocalEngine::Generate's tokens, greedy and seeded with penalties and min_tokens.
TEST_F(EngineCoreTest, ChunkedPrefillThenDecodesEqualLocalEngine) {
  Start(/*num_blocks=*/256);
  const std::vector<int32_t> prompt = Prompt(13, 1);
  model::SamplingParams seeded{.temperature = 0.9f,
                               .top_p = 0.9f,
                               .seed = 11,
                               .max_tokens = 9,
                               .logprobs = 2,
                               .repetition_penalty = 1.3f,
                               .frequency_penalty = 0.5f,
                               .min_tokens = 3};
  const model::SamplingParams greedy{.max_tokens = 7, .ignore_eos = true};
  int64_t id = 1;
  for (const model::SamplingParams& p : {greedy, seeded}) {
    const std::vector<int32_t> want = Reference(prompt, p);
    for (int64_t chunk : {1, 3, 4, 13, 64}) {
      Sequence seq = Admit(id++, prompt, p);
      const model::StopReason stop = RunToStop(seq, chunk);
      EXPECT_NE(stop, model::StopReason::kNone);
      EXPECT_EQ(Output(seq), want) << "chunks of " << chunk;
      kv_->Finish(*seq.table, seq.tokens, /*publish=*/false);
    }
  }
  EXPECT_TRUE(AllFree());
}

// One step holding a decode, a prompt chunk that samples nothing, a scored final chunk and a
// plain final chunk: each row goes back to its own sequence (MapRows), tokens and prompt scores
// equal each sequence run alone.
TEST_F(EngineCoreTest, MixedBatchMapsEachRowToItsSequence) {
  Start(/*num_blocks=*/256, /*caching=*/false);
  const model::SamplingParams greedy{.max_tokens = 6, .ignore_eos = true, .logprobs = 1};
  model::SamplingParams scored = greedy;
  scored.prompt_logprobs = 2;
  Sequence dec = Admit(1, Prompt(6, 1), greedy);
  ASSERT_EQ(RunToStop(dec, 64), model::StopReason::kMaxTokens);  // alone, for its reference
  const std::vector<int32_t> dec_want = Output(dec);
  kv_->Finish(*dec.table, dec.tokens, false);
  dec = Admit(1, Prompt(6, 1), greedy);
  {
    StepItem first{.seq = &dec, .tokens = 6};
    ASSERT_TRUE(step_->Run({&first, 1}).ok());
  }
  Sequence partial = Admit(2, Prompt(20, 2), greedy);
  Sequence score = Admit(3, Prompt(9, 3), scored);
  Sequence plain = Admit(4, Prompt(5, 4), greedy);
  ASSERT_TRUE(dec.decoding());
  ASSERT_TRUE(kv_->Grow(*dec.table, dec.computed() + 1).ok());
  std::vector<StepItem> items = {{&dec, 1}, {&partial, 7}, {&score, 9}, {&plain, 5}};
  auto out = step_->Run(items);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 4u);
  EXPECT_TRUE((*out)[0].decode && (*out)[0].sampled);
  EXPECT_FALSE((*out)[1].decode || (*out)[1].sampled);
  EXPECT_TRUE((*out)[2].sampled && (*out)[3].sampled);
  EXPECT_EQ(dec.generated(), 2);
  EXPECT_EQ(partial.computed(), 7);
  EXPECT_EQ(partial.generated(), 0);
  ASSERT_EQ(score.prompt_logprobs.size(), 8u);
  EXPECT_EQ(score.prompt_logprobs[0].id, score.tokens[1]);
  EXPECT_EQ(score.prompt_logprobs[0].top_logprobs.size(), 2u);
  EXPECT_TRUE(plain.prompt_logprobs.empty());
  // Every sequence runs on to its stop and matches its run alone.
  for (Sequence* s : {&dec, &partial, &score, &plain}) {
    EXPECT_NE(RunToStop(*s, 64), model::StopReason::kNone);
  }
  EXPECT_EQ(Output(dec), dec_want);
  EXPECT_EQ(Output(partial), Reference(Prompt(20, 2), greedy));
  EXPECT_EQ(Output(score), Reference(Prompt(9, 3), greedy));
  EXPECT_EQ(Output(plain), Reference(Prompt(5, 4), greedy));
  EXPECT_EQ(score.prompt_logprobs.size(), 8u) << "scored once, before the first token";
  for (Sequence* s : {&dec, &partial, &score, &plain}) kv_->Finish(*s->table, s->tokens, false);
  EXPECT_TRUE(AllFree());
}

// The one stop rule: max_tokens (counting tokens generated before a resume), EOS unless
// ignore_eos, a stop token, min_tokens first, and a full context.
TEST_F(EngineCoreTest, AppendAppliesTheStopRule) {
  Start(/*num_blocks=*/64, /*caching=*/false, /*max_positions=*/24);
  const int32_t eos = engine_->eos_ids().at(0);
  auto appended = [&](model::SamplingParams p, std::vector<int32_t> tokens, int generated_before,
                      int32_t token) {
    Sequence seq(1, std::move(tokens), generated_before, p, engine_->eos_ids());
    return step_->Append(seq, token).value();
  };
  EXPECT_EQ(appended({.max_tokens = 3}, Prompt(4, 1), 0, 7), model::StopReason::kNone);
  EXPECT_EQ(appended({.max_tokens = 3}, Prompt(4, 1), 2, 7), model::StopReason::kMaxTokens);
  EXPECT_EQ(appended({.max_tokens = 9}, Prompt(4, 1), 0, eos), model::StopReason::kEos);
  EXPECT_EQ(appended({.max_tokens = 9, .ignore_eos = true}, Prompt(4, 1), 0, eos),
            model::StopReason::kNone);
  EXPECT_EQ(appended({.max_tokens = 9, .stop_token_ids = {7}}, Prompt(4, 1), 0, 7),
            model::StopReason::kStopToken);
  EXPECT_EQ(appended({.max_tokens = 9, .min_tokens = 2}, Prompt(4, 1), 0, eos),
            model::StopReason::kNone);
  // A full context of 24 positions: after a prompt of 23 the first token (position 23) is
  // still computed, the second would be past the context.
  const model::SamplingParams lots{.max_tokens = 100, .ignore_eos = true};
  Sequence full = Admit(2, Prompt(23, 2), lots);
  EXPECT_EQ(RunToStop(full, 64), model::StopReason::kMaxTokens);
  EXPECT_EQ(Output(full).size(), 2u);
  EXPECT_EQ(Output(full), Reference(Prompt(23, 2), lots));
  kv_->Finish(*full.table, full.tokens, false);
  EXPECT_TRUE(AllFree());
}

// Items the step refuses (nothing pending, more than pending, a sequence twice, no table), and
// a table without room for its tokens (Forward never allocates): the step fails whole and no
// sequence changes.
TEST_F(EngineCoreTest, RefusedStepsChangeNothing) {
  Start(/*num_blocks=*/64);
  const model::SamplingParams greedy{.max_tokens = 4, .ignore_eos = true};
  Sequence a = Admit(1, Prompt(8, 1), greedy);
  Sequence b = Admit(2, Prompt(5, 2), greedy);
  Sequence none(3, Prompt(5, 3), 0, greedy, engine_->eos_ids());
  for (std::vector<StepItem> items : std::vector<std::vector<StepItem>>{
           {{&a, 0}}, {{&a, 9}}, {{&a, 8}, {&a, 8}}, {{&none, 5}}, {{nullptr, 1}}}) {
    auto out = step_->Run(items);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
  }
  // b's table holds 8 tokens: after its prompt, its first decode has room, a second does not
  // until it grows.
  StepItem both[] = {{&a, 8}, {&b, 5}};
  ASSERT_TRUE(step_->Run(both).ok());
  ASSERT_TRUE(a.decoding() && b.decoding());
  ASSERT_TRUE(kv_->Grow(*b.table, b.computed() + 1).ok());
  const int64_t a_blocks = static_cast<int64_t>(a.table->blocks().size());
  StepItem decodes[] = {{&b, 1}, {&a, 1}};  // a has no room for position 8
  auto out = step_->Run(decodes);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
  EXPECT_EQ(a.computed(), 8);
  EXPECT_EQ(b.computed(), 5);
  EXPECT_EQ(a.generated(), 1);
  EXPECT_EQ(b.generated(), 1);
  EXPECT_EQ(static_cast<int64_t>(a.table->blocks().size()), a_blocks);
  for (Sequence* s : {&a, &b}) kv_->Finish(*s->table, s->tokens, false);
  EXPECT_TRUE(AllFree());
}

// Growth runs oldest first; with no room the newest running sequence is preempted (its complete
// blocks published, every block freed), also when it is the one that needs room, and a claim
// that needs nothing allocates nothing.
TEST_F(EngineCoreTest, GrowOrPreemptTakesTheNewestFirst) {
  Start(/*num_blocks=*/7);
  const model::SamplingParams greedy{.max_tokens = 40, .ignore_eos = true};
  std::vector<Sequence> seqs;
  for (int i = 0; i < 3; ++i) seqs.push_back(Admit(i + 1, Prompt(6, i), greedy));  // 2 blocks
  // Each computes its prompt (its first block published after the step) and two decodes: 8
  // tokens, its second block complete but not yet published.
  for (int step = 0; step < 3; ++step) {
    std::vector<StepItem> items;
    for (Sequence& s : seqs) items.push_back({&s, step == 0 ? 6 : 1});
    ASSERT_TRUE(step_->Run(items).ok());
  }
  ASSERT_EQ(seqs[2].computed(), 8);
  auto claims = [&](size_t n) {
    std::vector<kv::GrowthClaim> c;
    for (size_t i = 0; i < n; ++i) {
      c.push_back({seqs[i].table.get(), seqs[i].computed() + 1, seqs[i].tokens});
    }
    return c;
  };
  // One free block: the oldest takes it, the second preempts the third.
  std::vector<kv::Preemption> seen;
  const int64_t published = kv_->counters().published_blocks;
  size_t kept = kv_->GrowOrPreempt(claims(3), [&](const kv::Preemption& p) { seen.push_back(p); });
  EXPECT_EQ(kept, 2u);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].victim, 2u);
  EXPECT_EQ(seen[0].claimer, 1u);
  EXPECT_EQ(seen[0].freed_blocks, 2);
  EXPECT_EQ(seen[0].why.code(), absl::StatusCode::kResourceExhausted) << seen[0].why;
  EXPECT_EQ(seqs[2].table->blocks().size(), 0u);
  EXPECT_EQ(kv_->counters().published_blocks, published + 1) << "its second block is cached";
  EXPECT_EQ(seqs[0].table->capacity(), 12);
  EXPECT_EQ(seqs[1].table->capacity(), 12);
  // Room already there: nothing allocated, nobody preempted.
  seen.clear();
  const int64_t used = pool_->Stats().used;
  EXPECT_EQ(kv_->GrowOrPreempt(claims(2), [&](const kv::Preemption& p) { seen.push_back(p); }), 2u);
  EXPECT_TRUE(seen.empty());
  EXPECT_EQ(pool_->Stats().used, used);
  // The newest needs more than is left: it preempts itself, the older keeps its blocks.
  std::vector<kv::GrowthClaim> c = claims(2);
  c[1].total_tokens = 40;
  EXPECT_EQ(kv_->GrowOrPreempt(c, [&](const kv::Preemption& p) { seen.push_back(p); }), 1u);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].victim, 1u);
  EXPECT_EQ(seen[0].claimer, 1u);
  EXPECT_EQ(seqs[0].table->capacity(), 12);
  kv_->Finish(*seqs[0].table, seqs[0].tokens, false);
  EXPECT_TRUE(AllFree());
}

// The end of a sequence: finished (or cancelled) publishes its complete blocks, prompt and
// generated tokens but the last, and frees every block; a failed one publishes nothing.
TEST_F(EngineCoreTest, FinishPublishesOrNotAndFreesEverything) {
  Start(/*num_blocks=*/64);
  const model::SamplingParams greedy{.max_tokens = 6, .ignore_eos = true};
  Sequence done = Admit(1, Prompt(10, 1), greedy);
  ASSERT_EQ(RunToStop(done, 64), model::StopReason::kMaxTokens);
  ASSERT_EQ(done.tokens.size(), 16u);  // K/V of 15: 3 full blocks
  EXPECT_EQ(kv_->Finish(*done.table, done.tokens, /*publish=*/true), 4);
  EXPECT_TRUE(AllFree());
  EXPECT_EQ(pool_->Stats().cached, 3);
  // A cancelled one mid-decode: the same.
  Sequence cancelled = Admit(2, Prompt(9, 2), {.max_tokens = 100, .ignore_eos = true});
  StepItem item{.seq = &cancelled, .tokens = 9};
  ASSERT_TRUE(step_->Run({&item, 1}).ok());
  kv_->Finish(*cancelled.table, cancelled.tokens, /*publish=*/true);
  EXPECT_TRUE(AllFree());
  EXPECT_EQ(pool_->Stats().cached, 5);
  // A failed one: only what its prompt's step published (a prefill chunk's blocks are shared
  // after the step), not the block its decodes completed.
  Sequence failed = Admit(3, Prompt(6, 3), greedy);
  item = {.seq = &failed, .tokens = 6};
  ASSERT_TRUE(step_->Run({&item, 1}).ok());
  for (int i = 0; i < 2; ++i) {
    item = {.seq = &failed, .tokens = 1};
    ASSERT_TRUE(step_->Run({&item, 1}).ok());
  }
  ASSERT_EQ(failed.computed(), 8);
  kv_->Finish(*failed.table, failed.tokens, /*publish=*/false);
  EXPECT_TRUE(AllFree());
  EXPECT_EQ(pool_->Stats().cached, 5 + 1);
  // The finished one's next turn takes its complete blocks from the cache, token-exact.
  std::vector<int32_t> turn = done.tokens;
  turn.push_back(5);
  Sequence next = Admit(4, turn, greedy);
  EXPECT_EQ(next.cached_tokens, 12);
  ASSERT_EQ(RunToStop(next, 64), model::StopReason::kMaxTokens);
  EXPECT_EQ(Output(next), Reference(turn, greedy));
  kv_->Finish(*next.table, next.tokens, true);
  EXPECT_TRUE(AllFree());
}

// A preempted sequence resumed by computing its prompt and every token it generated (its
// published blocks hit) samples on exactly where it stopped: the same tokens as a run alone,
// greedy and seeded with penalties.
TEST_F(EngineCoreTest, PreemptedSequenceResumesTokenExact) {
  Start(/*num_blocks=*/10);
  model::SamplingParams seeded{.temperature = 0.8f,
                               .seed = 3,
                               .max_tokens = 14,
                               .ignore_eos = true,
                               .presence_penalty = 0.7f};
  const model::SamplingParams greedy{.max_tokens = 14, .ignore_eos = true};
  const std::vector<int32_t> pa = Prompt(8, 1), pb = Prompt(8, 2);  // 22 tokens: 6 blocks each
  std::vector<Sequence> running;
  running.push_back(Admit(1, pa, greedy));
  running.push_back(Admit(2, pb, seeded));
  std::vector<Sequence> waiting;
  int preemptions = 0;
  std::vector<Sequence> finished;
  for (int steps = 0; steps < 200 && finished.size() < 2; ++steps) {
    // Resume a waiting one when it fits beside the others (with the headroom rule).
    if (!waiting.empty()) {
      Sequence& w = waiting.front();
      const int64_t need = pool_->layout().BlocksForTokens(w.tokens.size());
      if (kv_->HasRoomToAdmit(need, static_cast<int64_t>(running.size()))) {
        auto blocks = kv_->AllocateSequence(w.tokens, w.tokens.size());
        ASSERT_TRUE(blocks.ok()) << blocks.status();
        EXPECT_GT(blocks->cached_tokens, 0) << "its published blocks are hit";
        w.cached_tokens = blocks->cached_tokens;
        w.table = std::move(*blocks).MakeTable(pool_.get());
        running.push_back(std::move(w));
        waiting.erase(waiting.begin());
      }
    }
    std::vector<kv::GrowthClaim> claims;
    for (Sequence& s : running) {
      claims.push_back({s.table.get(), s.computed() + (s.decoding() ? 1 : 0), s.tokens});
    }
    std::vector<size_t> victims;
    const size_t kept =
        kv_->GrowOrPreempt(claims, [&](const kv::Preemption& p) { victims.push_back(p.victim); });
    for (size_t v : victims) {
      ++preemptions;
      running[v].table.reset();
      waiting.insert(waiting.begin(), std::move(running[v]));
    }
    running.resize(kept);
    std::vector<StepItem> items;
    for (Sequence& s : running) items.push_back({&s, s.pending()});
    if (items.empty()) continue;
    auto out = step_->Run(items);
    ASSERT_TRUE(out.ok()) << out.status();
    for (size_t i = running.size(); i-- > 0;) {
      if ((*out)[i].sampled && (*out)[i].stop != model::StopReason::kNone) {
        kv_->Finish(*running[i].table, running[i].tokens, true);
        finished.push_back(std::move(running[i]));
        running.erase(running.begin() + i);
      }
    }
  }
  ASSERT_EQ(finished.size(), 2u);
  EXPECT_GT(preemptions, 0) << "the pool was meant to force a preemption";
  for (const Sequence& s : finished) {
    EXPECT_EQ(Output(s),
              Reference(std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + s.prompt_len),
                        s.id == 1 ? greedy : seeded))
        << "sequence " << s.id;
  }
  EXPECT_TRUE(AllFree());
}

// A resumed request's prompt, given with the output it already sent (generated_before: what
// the prefill node gets as sample_step), is a prompt, never a decode: its last chunk, one token
// that completes a block, publishes that block like any prompt chunk, and samples exactly
// LocalEngine's token at that step (the given output counts for the penalties, min_tokens and
// the sample step).
TEST_F(EngineCoreTest, ResumedPromptIsPrefilledAndSamplesLocalEnginesTokenAtItsStep) {
  Start(/*num_blocks=*/256);
  // min_tokens bans EOS and the stop token from every step: ten tokens.
  const model::SamplingParams p{.temperature = 0.9f,
                                .seed = 21,
                                .max_tokens = 10,
                                .stop_token_ids = {7},
                                .logprobs = 2,
                                .repetition_penalty = 1.2f,
                                .presence_penalty = 0.8f,
                                .frequency_penalty = 0.4f,
                                .min_tokens = 10};
  const std::vector<int32_t> prompt = Prompt(11, 5);
  auto want = engine_->Generate(prompt, p);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(want->tokens.size(), 10u);
  int64_t id = 1;
  for (int step : {1, 5, 9}) {  // 12, 16 and 20 tokens: the last one completes a block
    std::vector<int32_t> tokens = prompt;
    tokens.insert(tokens.end(), want->generated_ids.begin(), want->generated_ids.begin() + step);
    Sequence seq = Admit(id++, tokens, p, /*generated_before=*/step);
    ASSERT_NE(seq.table, nullptr);
    EXPECT_EQ(seq.generated(), step);
    const StepItem most{.seq = &seq, .tokens = seq.pending() - 1};
    ASSERT_TRUE(step_->Run({&most, 1}).ok());
    EXPECT_FALSE(seq.decoding()) << "one token of its prompt left, not a decode";
    const int64_t published = kv_->counters().published_blocks;
    const StepItem last{.seq = &seq, .tokens = 1};
    auto out = step_->Run({&last, 1});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_FALSE((*out)[0].decode);
    EXPECT_EQ(kv_->counters().published_blocks, published + 1) << "the block it completed";
    ASSERT_TRUE((*out)[0].sampled);
    EXPECT_EQ((*out)[0].token.id, want->generated_ids[step]) << "step " << step;
    EXPECT_EQ((*out)[0].token.logprob, want->tokens[step].logprob) << "step " << step;
    EXPECT_EQ((*out)[0].token.top_logprobs, want->tokens[step].top_logprobs) << "step " << step;
    // The next step is a decode: the token it appended.
    EXPECT_TRUE(seq.decoding());
    kv_->Finish(*seq.table, seq.tokens, /*publish=*/false);
  }
  EXPECT_TRUE(AllFree());
}

// MapRows refuses an output whose rows are not the batch's.
TEST(MapRowsTest, RefusesRowsThatAreNotTheBatchs) {
  const model::SamplingParams p;
  std::vector<model::SequenceInput> batch(3);
  batch[0] = {.seq_id = 7, .tokens = {1, 2, 3}, .want_logits = false, .sample = &p};
  batch[1] = {.seq_id = 8, .tokens = {1, 2}, .want_logits = false};
  batch[2] = {.seq_id = 9, .tokens = {1, 2}, .want_logits = false, .all_logits = true};
  model::ForwardOutput out;
  out.seq_ids = {7, 9, 9};
  auto rows = MapRows(batch, out);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ((*rows)[0].first, 0u);
  EXPECT_EQ((*rows)[0].end, 1u);
  EXPECT_EQ((*rows)[1].first, (*rows)[1].end);
  EXPECT_EQ((*rows)[2].first, 1u);
  EXPECT_EQ((*rows)[2].end, 3u);
  for (std::vector<int64_t> bad :
       std::vector<std::vector<int64_t>>{{7, 9}, {9, 7, 9}, {7, 9, 9, 9}, {7, 8, 9, 9}}) {
    out.seq_ids = bad;
    EXPECT_EQ(MapRows(batch, out).status().code(), absl::StatusCode::kInternal);
  }
}

}  // namespace
}  // namespace duet::engine
