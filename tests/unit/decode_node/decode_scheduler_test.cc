// DecodeScheduler driven in one process: a real prefill (LocalEngine's runner) streams KV over
// the inproc transport into the scheduler's pool; tokens must equal LocalEngine::Generate.
#include "decode_node/decode_scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "common/base/clock.h"
#include "common/base/error_reason.h"
#include "tests/unit/decode_node/decode_test_util.h"
#include "transfer/kv_stream/kv_notice.h"

namespace duet::decode {
namespace {

TEST(ExposedTransferTail, MeasuredFromTheEndOfTheForwardPass) {
  // The forward pass ended at 1000 (its last layer's K/V at 900); ready here at 1500.
  EXPECT_EQ(ExposedTransferTailUs(1000, 900, 1500), 500);
  // An older sender without forward_done: from its last layer.
  EXPECT_EQ(ExposedTransferTailUs(0, 900, 1500), 600);
  // Everything landed before P's clock says the pass ended (another host's clock): no tail.
  EXPECT_EQ(ExposedTransferTailUs(1000, 900, 950), 0);
  EXPECT_EQ(ExposedTransferTailUs(0, 0, 1500), 0);
}

using testing::DecodeHarness;
using testing::DrainStream;
using testing::Tokens;

// Polls `pred` until true or `timeout`.
template <typename Pred>
bool Eventually(Pred pred, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time deadline = DeadlineIn(timeout);
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return pred();
}

bool AllFree(DecodeHarness& h) {
  const kv::BlockPoolStats s = h.d_pool().Stats();
  return s.available() == s.total && s.quarantined == 0;
}

class DecodeSchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(h_.Init({}).ok()); }
  DecodeHarness h_;
};

struct Case {
  std::string text;
  model::SamplingParams params;
};

// Several requests of different lengths (crossing block boundaries, block size 4), greedy and
// seeded, decoded in one continuous batch (they join at different steps): every token, logprob
// and finish reason equals a single-process run.
void ExpectTokensEqualLocalEngine(DecodeHarness& h_) {
  std::vector<Case> cases = {
      {"a", {.max_tokens = 20}},
      {"hello", {.max_tokens = 16}},
      {"abcdefg", {.temperature = 0.9f, .top_p = 0.95f, .seed = 7, .max_tokens = 24}},
      {"the quick brown fox jumps",
       {.temperature = 1.2f, .top_k = 20, .seed = 99, .max_tokens = 18}},
      {"0123456789abcdef0123456789abcdef", {.max_tokens = 30, .logprobs = 3}},
      {"xyz", {.temperature = 0.7f, .seed = 3, .max_tokens = 12, .ignore_eos = true}},
  };
  // One request that ends on a stop token the reference reaches mid-way.
  {
    std::vector<int32_t> prompt = h_.Encode("stop here");
    auto probe = h_.Reference(prompt, {.max_tokens = 12});
    ASSERT_TRUE(probe.ok()) << probe.status();
    cases.push_back({"stop here", {.max_tokens = 12, .stop_token_ids = {probe->generated_ids[6]}}});
  }

  std::vector<std::shared_ptr<TokenStream>> streams;
  std::vector<int32_t> firsts;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<int32_t> prompt = h_.Encode(cases[i].text);
    const std::string id = "req-" + std::to_string(i);
    auto res = h_.scheduler().Reserve(h_.Args(id, prompt, cases[i].params));
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ(res->blocks.size(), (prompt.size() + 3) / 4);
    auto stream = h_.scheduler().Subscribe(id);  // before the KV lands, as the coordinator may
    ASSERT_TRUE(stream.ok()) << stream.status();
    streams.push_back(*stream);
    auto first = h_.Prefill(prompt, cases[i].params, *res);
    ASSERT_TRUE(first.ok()) << first.status();
    firsts.push_back(first->id);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].text);
    std::vector<DecodeEvent> events = DrainStream(*streams[i], absl::Seconds(10));
    ASSERT_FALSE(events.empty());
    ASSERT_TRUE(events.back().finished());
    EXPECT_TRUE(events.front().admitted);
    EXPECT_EQ(events.front().layer_transfer_us.size(), 2u);  // tiny has 2 layers
    for (size_t k = 1; k < events.size(); ++k) {
      if (events[k].has_token) {
        EXPECT_EQ(events[k].index, static_cast<int>(k));
      }
    }
    auto ref = h_.Reference(h_.Encode(cases[i].text), cases[i].params);
    ASSERT_TRUE(ref.ok()) << ref.status();
    EXPECT_EQ(Tokens(firsts[i], events), ref->generated_ids);
    EXPECT_EQ(events.back().finish, FinishReasonFromStop(ref->stop));
    size_t t = 1;  // reference token index
    for (const DecodeEvent& e : events) {
      if (!e.has_token || t >= ref->tokens.size()) continue;
      EXPECT_EQ(e.token.logprob, ref->tokens[t].logprob);
      EXPECT_EQ(e.token.top_logprobs, ref->tokens[t].top_logprobs);
      ++t;
    }
  }
  EXPECT_EQ(streams.back()->finished(), true);
  EXPECT_TRUE(Eventually([&] { return AllFree(h_); }));
  EXPECT_EQ(h_.scheduler().Load().running_requests, 0);
  EXPECT_EQ(h_.scheduler().Load().pending_requests, 0);
}

TEST_F(DecodeSchedulerTest, TokensEqualLocalEngineForConcurrentRequests) {
  ExpectTokensEqualLocalEngine(h_);
}

// The same with the KV landing in a host mirror and copied into the pool at admission
// (--kv_staging): the pool is never the transport's region, so a missed copy decodes garbage.
TEST(DecodeSchedulerStaging, TokensEqualLocalEngineThroughTheHostMirror) {
  DecodeHarness h;
  ASSERT_TRUE(h.Init({.staged = true}).ok());
  ExpectTokensEqualLocalEngine(h);
}

// 64 requests of mixed lengths (1..300 tokens) in flight at once, half greedy and half seeded:
// all finish with the single-process tokens, and every block is free afterwards.
TEST(DecodeSchedulerLoad, SixtyFourConcurrentRequestsOfMixedLengths) {
  DecodeHarness h;
  ASSERT_TRUE(h.Init({.block_size = 4, .d_blocks = 8192, .max_running = 64}).ok());
  constexpr int kRequests = 64;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<model::SamplingParams> params;
  std::vector<Reservation> reservations;
  std::vector<std::shared_ptr<TokenStream>> streams;
  uint64_t x = 12345;
  auto next = [&x] { return (x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  for (int i = 0; i < kRequests; ++i) {
    const int len = 1 + static_cast<int>(next() % 300);
    std::vector<int32_t> prompt(len);
    for (int32_t& t : prompt) t = static_cast<int32_t>(next() % 256);
    prompts.push_back(prompt);
    model::SamplingParams p{.max_tokens = 20 + static_cast<int>(next() % 40)};
    if (i % 2 == 1) {
      p.temperature = 0.8f;
      p.top_p = 0.9f;
      p.seed = next();
    }
    params.push_back(p);
    auto res = h.scheduler().Reserve(h.Args("m" + std::to_string(i), prompt, p));
    ASSERT_TRUE(res.ok()) << res.status();
    reservations.push_back(*res);
    auto stream = h.scheduler().Subscribe("m" + std::to_string(i));
    ASSERT_TRUE(stream.ok());
    streams.push_back(*stream);
  }
  EXPECT_EQ(h.scheduler().Reserve(h.Args("one-too-many", prompts[0], params[0])).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Every layer of every request lands first; the final notices then go out in a burst, so the
  // requests join the batch at nearly the same step and decode together.
  std::vector<int32_t> firsts;
  std::vector<std::string> finals(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    auto first = h.Prefill(prompts[i], params[i], reservations[i], -1, &finals[i]);
    ASSERT_TRUE(first.ok()) << first.status();
    firsts.push_back(first->id);
  }
  EXPECT_EQ(h.scheduler().Load().running_requests, 0);
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(h.sender().Finish(reservations[i].transfer_id, finals[i]).ok());
  }
  int peak_running = 0;
  for (int i = 0; i < 200 && peak_running < 32; ++i) {
    peak_running = std::max(peak_running, h.scheduler().Load().running_requests);
    absl::SleepFor(absl::Microseconds(200));
  }
  EXPECT_GE(peak_running, 32);
  for (int i = 0; i < kRequests; ++i) {
    SCOPED_TRACE(i);
    std::vector<DecodeEvent> events = DrainStream(*streams[i], absl::Seconds(20));
    ASSERT_FALSE(events.empty());
    ASSERT_TRUE(events.back().finished());
    auto ref = h.Reference(prompts[i], params[i]);
    ASSERT_TRUE(ref.ok());
    EXPECT_EQ(Tokens(firsts[i], events), ref->generated_ids);
    EXPECT_EQ(events.back().finish, FinishReasonFromStop(ref->stop));
  }
  EXPECT_TRUE(Eventually([&] { return AllFree(h); }));
}

// Runs one request through Reserve, the sender and the stream; returns its tokens (the first
// one included) and the reservation.
std::vector<int32_t> RunOne(DecodeHarness& h, const std::string& id,
                            const std::vector<int32_t>& prompt, const model::SamplingParams& p,
                            Reservation* reservation) {
  auto res = h.scheduler().Reserve(h.Args(id, prompt, p));
  EXPECT_TRUE(res.ok()) << res.status();
  if (!res.ok()) return {};
  *reservation = *res;
  auto stream = h.scheduler().Subscribe(id);
  EXPECT_TRUE(stream.ok()) << stream.status();
  auto first = h.Prefill(prompt, p, *res);
  EXPECT_TRUE(first.ok()) << first.status();
  if (!stream.ok() || !first.ok()) return {};
  std::vector<DecodeEvent> events = DrainStream(**stream, absl::Seconds(10));
  EXPECT_TRUE(!events.empty() && events.back().finished());
  return Tokens(first->id, events);
}

// Prefix caching on D: a finished request's blocks (prompt and generated tokens) stay cached,
// so the next turn of a chat reserves only the blocks after them and the sender writes only
// those; the tokens still equal a single-process run (greedy and seeded).
TEST_F(DecodeSchedulerTest, NextTurnReservesAndReceivesOnlyItsNewBlocks) {
  for (bool seeded : {false, true}) {
    model::SamplingParams p{.max_tokens = 8, .ignore_eos = true};
    if (seeded) p = {.temperature = 0.9f, .seed = 11, .max_tokens = 8, .ignore_eos = true};
    const std::string tag = seeded ? "s" : "g";
    const std::vector<int32_t> a = h_.Encode(tag + " the quick brown fox jumps over the lazy dog");
    Reservation ra;
    const std::vector<int32_t> out_a = RunOne(h_, tag + "a", a, p, &ra);
    EXPECT_EQ(ra.cached_blocks, 0);
    auto ref_a = h_.Reference(a, p);
    ASSERT_TRUE(ref_a.ok()) << ref_a.status();
    EXPECT_EQ(out_a, ref_a->generated_ids);
    // Turn 2: the conversation so far plus a new message.
    std::vector<int32_t> b = a;
    b.insert(b.end(), out_a.begin(), out_a.end());
    const std::vector<int32_t> more = h_.Encode(" and then what happened");
    b.insert(b.end(), more.begin(), more.end());
    Reservation rb;
    const std::vector<int32_t> out_b = RunOne(h_, tag + "b", b, p, &rb);
    // K/V exist for the prompt and every generated token but the last.
    const int64_t with_kv = static_cast<int64_t>(a.size() + out_a.size()) - 1;
    const int64_t n = static_cast<int64_t>(b.size());
    EXPECT_EQ(rb.cached_blocks, std::min(with_kv / 4, (n - 1) / 4));
    EXPECT_EQ(static_cast<int64_t>(rb.blocks.size()), (n + 3) / 4 - rb.cached_blocks);
    auto ref_b = h_.Reference(b, p);
    ASSERT_TRUE(ref_b.ok()) << ref_b.status();
    EXPECT_EQ(out_b, ref_b->generated_ids);
    // The same prompt again: all but the block of its last token is here.
    Reservation rc;
    const std::vector<int32_t> out_c = RunOne(h_, tag + "c", b, p, &rc);
    EXPECT_EQ(rc.cached_blocks, (n - 1) / 4);
    EXPECT_EQ(out_c, ref_b->generated_ids);
  }
  EXPECT_GT(h_.scheduler().PrefixCacheCounters().hit_tokens, 0);
  EXPECT_TRUE(Eventually([&] { return AllFree(h_); }));
}

// A reservation that took cached blocks and is released (or whose KV never lands) gives them
// back: nothing leaks and the cache still serves the next request.
TEST_F(DecodeSchedulerTest, ReleasedReservationGivesBackItsCachedBlocks) {
  const model::SamplingParams p{.max_tokens = 3, .ignore_eos = true};
  const std::vector<int32_t> a = h_.Encode("a prompt that spans several blocks of four");
  Reservation r0;
  RunOne(h_, "warm", a, p, &r0);
  auto res = h_.scheduler().Reserve(h_.Args("held", a, p));
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_GT(res->cached_blocks, 0);
  EXPECT_TRUE(h_.scheduler().Release("held").found);
  auto late = h_.scheduler().Reserve(h_.Args("never-lands", a, p, absl::Milliseconds(200)));
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_GT(late->cached_blocks, 0);
  auto stream = h_.scheduler().Subscribe("never-lands");
  ASSERT_TRUE(stream.ok());
  std::vector<DecodeEvent> events = DrainStream(**stream, absl::Seconds(10));
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().finish, FinishReason::kError);
  // Their own blocks stay quarantined (the sender never confirmed nothing is in flight,
  // invariant 4); the cached ones it took are back in the cache.
  const int64_t quarantined = static_cast<int64_t>(res->blocks.size() + late->blocks.size());
  auto only_quarantine_held = [&] {
    const kv::BlockPoolStats s = h_.d_pool().Stats();
    return s.used == 0 && s.quarantined == quarantined;
  };
  EXPECT_TRUE(Eventually(only_quarantine_held))
      << h_.d_pool().Stats().used << " used, " << h_.d_pool().Stats().quarantined
      << " quarantined, want " << quarantined << "; " << events.size() << " events, "
      << events.back().error;
  Reservation r1;
  EXPECT_EQ(RunOne(h_, "again", a, p, &r1), h_.Reference(a, p)->generated_ids);
  EXPECT_GT(r1.cached_blocks, 0);
  EXPECT_TRUE(Eventually(only_quarantine_held));
}

// A prompt whose ids do not match num_tokens, or lie outside the vocabulary, is refused.
TEST_F(DecodeSchedulerTest, ReserveRefusesAPromptThatDoesNotMatch) {
  ReserveArgs args = h_.Args("bad", h_.Encode("abc"), {.max_tokens = 2});
  args.prompt.pop_back();
  auto res = h_.scheduler().Reserve(args);
  EXPECT_EQ(res.status().code(), absl::StatusCode::kInvalidArgument) << res.status();
  args = h_.Args("bad2", h_.Encode("abc"), {.max_tokens = 2});
  args.prompt[0] = -3;
  res = h_.scheduler().Reserve(args);
  EXPECT_EQ(res.status().code(), absl::StatusCode::kInvalidArgument) << res.status();
  EXPECT_TRUE(AllFree(h_));
}

TEST_F(DecodeSchedulerTest, FirstTokenThatStopsFinishesAtAdmission) {
  const std::vector<int32_t> prompt = h_.Encode("one token only");
  auto res = h_.scheduler().Reserve(h_.Args("r1", prompt, {.max_tokens = 1}));
  ASSERT_TRUE(res.ok()) << res.status();
  auto first = h_.Prefill(prompt, {.max_tokens = 1}, *res);
  ASSERT_TRUE(first.ok());
  // Subscribing after the request finished still yields its events.
  ASSERT_TRUE(Eventually([&] { return AllFree(h_); }));
  auto stream = h_.scheduler().Subscribe("r1");
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::vector<DecodeEvent> events = DrainStream(**stream, absl::Seconds(5));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_TRUE(events[0].admitted);
  EXPECT_FALSE(events[0].has_token);
  EXPECT_EQ(events[0].finish, FinishReason::kMaxTokens);
  EXPECT_EQ(h_.scheduler().Subscribe("r1").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DecodeSchedulerTest, ReserveRefusals) {
  const std::vector<int32_t> prompt = h_.Encode("refusals");
  // Layout mismatch names both sides.
  ReserveArgs bad = h_.Args("r1", prompt, {});
  bad.expected_layout.block_size = 8;
  auto r = h_.scheduler().Reserve(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("decode-0"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("prefill-0"), std::string::npos) << r.status();
  // More blocks than the pool has: it can never fit; nothing held.
  std::vector<int32_t> huge(4 * 256 + 1, 65);
  r = h_.scheduler().Reserve(h_.Args("r2", huge, {}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(AllFree(h_));

  // Bad sampling, empty prompt, unreachable sender.
  EXPECT_EQ(h_.scheduler().Reserve(h_.Args("r3", prompt, {.max_tokens = 0})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h_.scheduler().Reserve(h_.Args("r4", {}, {})).status().code(),
            absl::StatusCode::kInvalidArgument);
  ReserveArgs nowhere = h_.Args("r5", prompt, {});
  nowhere.sender_address = "not an address";
  EXPECT_FALSE(h_.scheduler().Reserve(nowhere).ok());
  EXPECT_TRUE(AllFree(h_));
  // Duplicate id.
  ASSERT_TRUE(h_.scheduler().Reserve(h_.Args("r6", prompt, {})).ok());
  EXPECT_EQ(h_.scheduler().Reserve(h_.Args("r6", prompt, {})).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(h_.scheduler().Load().pending_requests, 1);
  EXPECT_EQ(h_.scheduler().Load().queued_tokens, static_cast<int64_t>(prompt.size()));
  // Unknown ids.
  EXPECT_FALSE(h_.scheduler().Release("nope").found);
  EXPECT_EQ(h_.scheduler().Subscribe("nope").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(h_.scheduler().Subscribe("r6").ok());
  EXPECT_EQ(h_.scheduler().Subscribe("r6").status().code(), absl::StatusCode::kAlreadyExists);
}

TEST(DecodeSchedulerLimits, MaxRunningCountsPendingRequests) {
  DecodeHarness h;
  ASSERT_TRUE(h.Init({.max_running = 2}).ok());
  const std::vector<int32_t> prompt = h.Encode("slots");
  ASSERT_TRUE(h.scheduler().Reserve(h.Args("a", prompt, {})).ok());
  ASSERT_TRUE(h.scheduler().Reserve(h.Args("b", prompt, {})).ok());
  auto c = h.scheduler().Reserve(h.Args("c", prompt, {}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted) << c.status();
  // Releasing a waiting request before anything was written: the blocks are quarantined
  // until the sender confirms (its kAborted notice), then free.
  EXPECT_TRUE(h.scheduler().Release("a").found);
  EXPECT_TRUE(h.scheduler().Reserve(h.Args("c", prompt, {})).ok());
}

// Release while the KV is still arriving: the stream ends CANCELLED, the blocks stay
// quarantined until the sender confirms nothing is in flight, then every block is free.
TEST_F(DecodeSchedulerTest, ReleaseWhileWaitingQuarantinesUntilSenderConfirms) {
  const std::vector<int32_t> prompt = h_.Encode("cancel me while streaming");
  auto res = h_.scheduler().Reserve(h_.Args("w", prompt, {.max_tokens = 8}));
  ASSERT_TRUE(res.ok()) << res.status();
  auto stream = h_.scheduler().Subscribe("w");
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE(h_.Prefill(prompt, {.max_tokens = 8}, *res, /*layers_to_send=*/1).ok());
  const ReleaseResult rel = h_.scheduler().Release("w");
  EXPECT_TRUE(rel.found);
  EXPECT_EQ(rel.freed_blocks, static_cast<int64_t>(res->blocks.size()));
  std::vector<DecodeEvent> events = DrainStream(**stream, absl::Seconds(5));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish, FinishReason::kCancelled);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(h_.d_pool().Stats().quarantined, static_cast<int64_t>(res->blocks.size()));
  ASSERT_TRUE(h_.sender().Abort(res->transfer_id, DeadlineIn(absl::Seconds(1)), "released").ok());
  EXPECT_TRUE(Eventually([&] { return AllFree(h_); }));
  EXPECT_FALSE(h_.scheduler().Release("w").found);  // the subscriber took its events
}

// A coordinator that dies between Reserve and StreamTokens leaves reservations nobody claims:
// one still waiting for its KV and one whose KV landed (it decodes for nobody). Both are
// released once unclaimed_timeout has passed, every block back (the waiting one's after its
// sender confirms), and a late subscriber reads why; a claimed reservation beside them ends
// as it would have.
TEST(DecodeSchedulerUnclaimed, ReservationsNobodyStreamsAreReleased) {
  DecodeHarness h;
  ASSERT_TRUE(h.Init({.d_blocks = 2048,
                      .unclaimed_timeout = absl::Milliseconds(50),
                      .housekeeping_interval = absl::Milliseconds(5)})
                  .ok());
  const model::SamplingParams longp{.max_tokens = 4000, .ignore_eos = true};
  const model::SamplingParams shortp{.max_tokens = 8, .ignore_eos = true};
  const std::vector<int32_t> pr = h.Encode("running for nobody");
  const std::vector<int32_t> pw = h.Encode("waiting for a coordinator");
  const std::vector<int32_t> pc = h.Encode("claimed");
  auto running = h.scheduler().Reserve(h.Args("running", pr, longp));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_TRUE(h.Prefill(pr, longp, *running).ok());
  auto waiting = h.scheduler().Reserve(h.Args("waiting", pw, longp));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  ASSERT_TRUE(h.Prefill(pw, longp, *waiting, /*layers_to_send=*/1).ok());

  ASSERT_TRUE(Eventually([&] { return h.scheduler().unclaimed_released() == 2; }));
  EXPECT_TRUE(Eventually([&] {
    const SchedulerLoad load = h.scheduler().Load();
    return load.running_requests == 0 && load.pending_requests == 0;
  }));
  // A claimed reservation made now runs to its end.
  auto claimed = h.scheduler().Reserve(h.Args("claimed", pc, shortp));
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  auto claimed_stream = h.scheduler().Subscribe("claimed");
  ASSERT_TRUE(claimed_stream.ok());
  auto claimed_first = h.Prefill(pc, shortp, *claimed);
  ASSERT_TRUE(claimed_first.ok()) << claimed_first.status();

  auto late = h.scheduler().Subscribe("waiting");
  ASSERT_TRUE(late.ok()) << late.status();
  std::vector<DecodeEvent> events = DrainStream(**late, absl::Seconds(2));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish, FinishReason::kError);
  EXPECT_EQ(events[0].error.code(), absl::StatusCode::kDeadlineExceeded) << events[0].error;
  auto late_running = h.scheduler().Subscribe("running");
  ASSERT_TRUE(late_running.ok()) << late_running.status();
  events = DrainStream(**late_running, absl::Seconds(2));
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(events.front().admitted);  // it was decoding when it was released
  EXPECT_EQ(events.back().finish, FinishReason::kCancelled);
  EXPECT_LT(events.size(), static_cast<size_t>(longp.max_tokens));
  std::printf("the unclaimed running request was cancelled after %zu tokens\n", events.size());

  std::vector<DecodeEvent> claimed_events = DrainStream(**claimed_stream, absl::Seconds(10));
  auto ref = h.Reference(pc, shortp);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(Tokens(claimed_first->id, claimed_events), ref->generated_ids);
  ASSERT_TRUE(
      h.sender().Abort(waiting->transfer_id, DeadlineIn(absl::Seconds(1)), "released").ok());
  EXPECT_TRUE(Eventually([&] { return AllFree(h); }));
  EXPECT_EQ(h.scheduler().unclaimed_released(), 2);
}

// A retry after a failed attempt (released, or its sender died) reserves the same id again,
// even when nobody read the first attempt's stream; a live id is refused.
TEST_F(DecodeSchedulerTest, ReleasedIdCanBeReservedAgain) {
  const model::SamplingParams p{.max_tokens = 6};
  const std::vector<int32_t> prompt = h_.Encode("retry me");
  auto first_try = h_.scheduler().Reserve(h_.Args("retry", prompt, p));
  ASSERT_TRUE(first_try.ok()) << first_try.status();
  EXPECT_EQ(h_.scheduler().Reserve(h_.Args("retry", prompt, p)).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(h_.scheduler().Release("retry").found);
  auto second_try = h_.scheduler().Reserve(h_.Args("retry", prompt, p));
  ASSERT_TRUE(second_try.ok()) << second_try.status();
  EXPECT_NE(second_try->transfer_id, first_try->transfer_id);
  auto stream = h_.scheduler().Subscribe("retry");
  ASSERT_TRUE(stream.ok());
  auto first = h_.Prefill(prompt, p, *second_try);
  ASSERT_TRUE(first.ok()) << first.status();
  std::vector<DecodeEvent> events = DrainStream(**stream, absl::Seconds(10));
  ASSERT_FALSE(events.empty());
  auto ref = h_.Reference(prompt, p);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(Tokens(first->id, events), ref->generated_ids);
  // The first attempt's blocks wait for its sender's confirmation, then all are free.
  ASSERT_TRUE(h_.p_transport()
                  .PostWrite(h_.to_d(), {},
                             transfer::EncodeKvNotice({.kind = transfer::KvNoticeKind::kAborted,
                                                       .request_id = first_try->transfer_id}))
                  .ok());
  EXPECT_TRUE(Eventually([&] { return AllFree(h_); }));
}

// Release while decoding: the request leaves the batch and its blocks are free when Release
// returns; other requests are not disturbed.
TEST_F(DecodeSchedulerTest, ReleaseWhileRunningFreesAtOnce) {
  const model::SamplingParams longp{.max_tokens = 2000, .ignore_eos = true};
  const model::SamplingParams shortp{.max_tokens = 10};
  const std::vector<int32_t> p1 = h_.Encode("long running request");
  const std::vector<int32_t> p2 = h_.Encode("a short one");
  auto r1 = h_.scheduler().Reserve(h_.Args("long", p1, longp));
  auto r2 = h_.scheduler().Reserve(h_.Args("short", p2, shortp));
  ASSERT_TRUE(r1.ok() && r2.ok());
  auto s1 = h_.scheduler().Subscribe("long");
  auto s2 = h_.scheduler().Subscribe("short");
  ASSERT_TRUE(s1.ok() && s2.ok());
  ASSERT_TRUE(h_.Prefill(p1, longp, *r1).ok());
  auto first2 = h_.Prefill(p2, shortp, *r2);
  ASSERT_TRUE(first2.ok());
  // Wait for a few decoded tokens of the long one.
  std::vector<DecodeEvent> got;
  ASSERT_TRUE(Eventually([&] {
    for (DecodeEvent& e : (*s1)->Pop(DeadlineIn(absl::Milliseconds(1)))) got.push_back(e);
    return got.size() >= 4;
  }));
  const ReleaseResult rel = h_.scheduler().Release("long");
  EXPECT_TRUE(rel.found);
  EXPECT_GE(rel.freed_blocks, static_cast<int64_t>(r1->blocks.size()));
  std::vector<DecodeEvent> rest = DrainStream(**s1, absl::Seconds(5));
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest.back().finish, FinishReason::kCancelled);
  std::vector<DecodeEvent> e2 = DrainStream(**s2, absl::Seconds(10));
  ASSERT_FALSE(e2.empty());
  auto ref2 = h_.Reference(p2, shortp);
  ASSERT_TRUE(ref2.ok());
  EXPECT_EQ(Tokens(first2->id, e2), ref2->generated_ids);
  EXPECT_TRUE(Eventually([&] { return AllFree(h_); }));
}

// A pool too small for two requests to grow (each fits alone): when one cannot get a block,
// the newest is preempted (kPreempted, its blocks back at once) and the other runs on. The
// preempted one, resumed from its prompt and the tokens it streamed (generated_tokens), ends
// with exactly the tokens of an uninterrupted run, numbered on from where it stopped, and
// max_tokens counts the tokens of both runs.
TEST(DecodeSchedulerLimits, PoolExhaustedMidDecodePreemptsTheNewestAndItResumesExactly) {
  DecodeHarness h;
  ASSERT_TRUE(h.Init({.block_size = 4, .d_blocks = 6}).ok());
  const model::SamplingParams p{.max_tokens = 14, .ignore_eos = true};  // 22 tokens: 6 blocks
  const std::vector<int32_t> a(8, 97), b(8, 98);                        // 2 blocks each
  auto ra = h.scheduler().Reserve(h.Args("a", a, p));
  auto rb = h.scheduler().Reserve(h.Args("b", b, p));
  ASSERT_TRUE(ra.ok() && rb.ok());
  auto sa = h.scheduler().Subscribe("a");
  auto sb = h.scheduler().Subscribe("b");
  ASSERT_TRUE(sa.ok() && sb.ok());
  // Both land before either is admitted (the final notices go last): they decode together.
  std::string final_a, final_b;
  auto fa = h.Prefill(a, p, *ra, -1, &final_a);
  auto fb = h.Prefill(b, p, *rb, -1, &final_b);
  ASSERT_TRUE(fa.ok() && fb.ok());
  ASSERT_TRUE(h.sender().Finish(ra->transfer_id, final_a).ok());
  ASSERT_TRUE(h.sender().Finish(rb->transfer_id, final_b).ok());
  std::vector<DecodeEvent> ea = DrainStream(**sa, absl::Seconds(10));
  std::vector<DecodeEvent> eb = DrainStream(**sb, absl::Seconds(10));
  ASSERT_FALSE(ea.empty());
  ASSERT_FALSE(eb.empty());
  // Exactly one was preempted (the one admitted last); the other ran to max_tokens.
  const bool a_preempted = ea.back().finish == FinishReason::kPreempted;
  const std::vector<int32_t>& kept_prompt = a_preempted ? b : a;
  const std::vector<int32_t>& lost_prompt = a_preempted ? a : b;
  const std::vector<DecodeEvent>& kept = a_preempted ? eb : ea;
  const std::vector<DecodeEvent>& lost = a_preempted ? ea : eb;
  const int32_t kept_first = a_preempted ? fb->id : fa->id;
  const int32_t lost_first = a_preempted ? fa->id : fb->id;
  auto ref_kept = h.Reference(kept_prompt, p);
  auto ref_lost = h.Reference(lost_prompt, p);
  ASSERT_TRUE(ref_kept.ok() && ref_lost.ok());
  EXPECT_EQ(kept.back().finish, FinishReason::kMaxTokens) << kept.back().error;
  EXPECT_EQ(Tokens(kept_first, kept), ref_kept->generated_ids);
  ASSERT_EQ(lost.back().finish, FinishReason::kPreempted) << lost.back().error;
  EXPECT_EQ(lost.back().error.code(), absl::StatusCode::kResourceExhausted) << lost.back().error;
  const std::vector<int32_t> got = Tokens(lost_first, lost);
  ASSERT_LT(got.size(), ref_lost->generated_ids.size());
  ASSERT_EQ(got, std::vector<int32_t>(ref_lost->generated_ids.begin(),
                                      ref_lost->generated_ids.begin() + got.size()));
  EXPECT_TRUE(Eventually([&] { return AllFree(h); }));

  // Resume it: its prompt and every token it streamed, the next one sampled by the sender.
  std::vector<int32_t> seq = lost_prompt;
  seq.insert(seq.end(), got.begin(), got.end());
  ReserveArgs args = h.Args("resumed", seq, p);
  args.generated_tokens = static_cast<int32_t>(got.size());
  auto rr = h.scheduler().Reserve(args);
  ASSERT_TRUE(rr.ok()) << rr.status();
  auto sr = h.scheduler().Subscribe("resumed");
  ASSERT_TRUE(sr.ok());
  auto fr = h.Prefill(seq, p, *rr);  // greedy: the sampling step does not change the token
  ASSERT_TRUE(fr.ok());
  std::vector<DecodeEvent> er = DrainStream(**sr, absl::Seconds(10));
  ASSERT_FALSE(er.empty());
  EXPECT_EQ(er.back().finish, FinishReason::kMaxTokens) << er.back().error;
  for (const DecodeEvent& e : er) {
    if (e.has_token) {
      EXPECT_GT(e.index, static_cast<int>(got.size()));
    }
  }
  std::vector<int32_t> all = got;
  for (int32_t t : Tokens(fr->id, er)) all.push_back(t);
  EXPECT_EQ(all, ref_lost->generated_ids);
  EXPECT_TRUE(Eventually([&] { return AllFree(h); }));
}

// A request whose prompt and next token could never fit the pool is refused at Reserve,
// naming the numbers, instead of being preempted forever.
TEST(DecodeSchedulerLimits, ReserveRefusesWhatCanNeverFitThePool) {
  DecodeHarness h;
  ASSERT_TRUE(h.Init({.block_size = 4, .d_blocks = 6}).ok());
  auto r = h.scheduler().Reserve(h.Args("big", std::vector<int32_t>(24, 97), {.max_tokens = 4}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("can never fit"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("holds 6"), std::string::npos) << r.status();
  EXPECT_TRUE(AllFree(h));
  // One that fits the pool but not what is free now: ResourceExhausted (it may pass), nothing
  // more held.
  ASSERT_TRUE(h.scheduler().Reserve(h.Args("held", std::vector<int32_t>(16, 97), {})).ok());
  r = h.scheduler().Reserve(h.Args("later", std::vector<int32_t>(12, 98), {}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_EQ(h.d_pool().Stats().available(), 2);
}

// KV that never lands fails at its deadline; a sender whose endpoint dies fails its request at
// once (both with a clear error on the stream, blocks back).
TEST_F(DecodeSchedulerTest, DeadlineAndSenderLoss) {
  const std::vector<int32_t> prompt = h_.Encode("never written");
  auto res = h_.scheduler().Reserve(h_.Args("late", prompt, {}, absl::Milliseconds(50)));
  ASSERT_TRUE(res.ok()) << res.status();
  auto stream = h_.scheduler().Subscribe("late");
  ASSERT_TRUE(stream.ok());
  std::vector<DecodeEvent> events = DrainStream(**stream, absl::Seconds(5));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish, FinishReason::kError);
  EXPECT_EQ(events[0].error.code(), absl::StatusCode::kDeadlineExceeded) << events[0].error;
  // The blocks wait in quarantine for the sender's word that nothing is in flight.
  EXPECT_EQ(h_.d_pool().Stats().quarantined, static_cast<int64_t>(res->blocks.size()));
  ASSERT_TRUE(h_.p_transport()
                  .PostWrite(h_.to_d(), {},
                             transfer::EncodeKvNotice({.kind = transfer::KvNoticeKind::kAborted,
                                                       .request_id = res->transfer_id}))
                  .ok());
  EXPECT_TRUE(Eventually([&] { return AllFree(h_); }));

  // A second sender that goes away mid-transfer.
  auto p2 = transfer::CreateTransport("inproc", {.name = "prefill-1", .layout = h_.layout()});
  ASSERT_TRUE(p2.ok());
  auto p2_region = (*p2)->AllocateRegion(h_.layout().RegionBytes(8));
  ASSERT_TRUE(p2_region.ok());
  ReserveArgs args = h_.Args("orphan", prompt, {});
  args.sender_name = "prefill-1";
  args.sender_address = *(*p2)->LocalAddress();
  auto res2 = h_.scheduler().Reserve(args);
  ASSERT_TRUE(res2.ok()) << res2.status();
  auto stream2 = h_.scheduler().Subscribe("orphan");
  ASSERT_TRUE(stream2.ok());
  p2->reset();
  events = DrainStream(**stream2, absl::Seconds(5));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish, FinishReason::kError);
  EXPECT_EQ(events[0].error.code(), absl::StatusCode::kUnavailable) << events[0].error;
  EXPECT_TRUE(Eventually([&] { return AllFree(h_); }));
}

// Shutdown ends every request with Unavailable and refuses new ones.
TEST_F(DecodeSchedulerTest, ShutdownEndsEverything) {
  const model::SamplingParams p{.max_tokens = 3000, .ignore_eos = true};
  const std::vector<int32_t> prompt = h_.Encode("shutdown");
  auto running = h_.scheduler().Reserve(h_.Args("running", prompt, p));
  auto waiting = h_.scheduler().Reserve(h_.Args("waiting", prompt, p));
  ASSERT_TRUE(running.ok() && waiting.ok());
  auto s1 = h_.scheduler().Subscribe("running");
  auto s2 = h_.scheduler().Subscribe("waiting");
  ASSERT_TRUE(s1.ok() && s2.ok());
  ASSERT_TRUE(h_.Prefill(prompt, p, *running).ok());
  ASSERT_TRUE(Eventually([&] { return h_.scheduler().Load().running_requests == 1; }));
  h_.scheduler().Shutdown();
  for (auto* s : {&*s1, &*s2}) {
    std::vector<DecodeEvent> ev = DrainStream(**s, absl::Seconds(5));
    ASSERT_FALSE(ev.empty());
    EXPECT_EQ(ev.back().finish, FinishReason::kError);
    EXPECT_EQ(ev.back().error.code(), absl::StatusCode::kUnavailable);
  }
  EXPECT_EQ(h_.scheduler().Reserve(h_.Args("new", prompt, p)).status().code(),
            absl::StatusCode::kUnavailable);
  h_.scheduler().Shutdown();  // idempotent
  const kv::BlockPoolStats stats = h_.d_pool().Stats();
  EXPECT_EQ(stats.used, 0);
  EXPECT_EQ(stats.available() + stats.quarantined, stats.total);
}

// A sender that never confirms a released transfer quiet is fenced after the bound: over inproc
// (its writes revoked) the blocks come back, the fence is counted, and a new Reserve naming it
// fails with the reason kSenderFenced (the coordinator then routes that request without it).
// Once it answers, the fence lifts and it is served again.
TEST(DecodeSchedulerQuarantine, SilentSenderIsFencedAfterTheBoundUntilItAnswers) {
  DecodeHarness h;
  ASSERT_TRUE(h.Init({.kv_quarantine_bound = absl::Milliseconds(200)}).ok());
  const std::vector<int32_t> prompt = h.Encode("a sender that stops answering");
  auto res = h.scheduler().Reserve(h.Args("q", prompt, {.max_tokens = 4}));
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_TRUE(h.Prefill(prompt, {.max_tokens = 4}, *res, /*layers_to_send=*/1).ok());
  const absl::Time released = absl::Now();
  EXPECT_TRUE(h.scheduler().Release("q").found);
  const int64_t held = static_cast<int64_t>(res->blocks.size());
  EXPECT_TRUE(Eventually([&] { return h.scheduler().quarantine_stats().blocks == held; }));
  EXPECT_TRUE(Eventually([&] { return AllFree(h); }, absl::Seconds(3)));
  EXPECT_GE(absl::Now() - released, absl::Milliseconds(200));
  const QuarantineStats q = h.scheduler().quarantine_stats();
  EXPECT_EQ(q.fenced_senders, 1);
  EXPECT_EQ(q.overdue_blocks, 0);
  auto again = h.scheduler().Reserve(h.Args("r", prompt, {.max_tokens = 4}));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(ReasonOf(again.status()), ErrorReason::kSenderFenced) << again.status();
  EXPECT_TRUE(AllFree(h));  // the refused Reserve holds nothing
  // The sender answers D's asks (sent again every fence_ask_interval): the fence lifts.
  EXPECT_TRUE(Eventually(
      [&] {
        h.sender().ServeQuietRequests();
        return h.scheduler().quarantine_stats().fenced_senders == 0;
      },
      absl::Seconds(5)));
  auto served = h.scheduler().Reserve(h.Args("s", prompt, {.max_tokens = 4}));
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_TRUE(h.scheduler().Release("s").found);
}

// A request waiting for its KV when the decode node fences its sender (another transfer of that
// sender was released and never confirmed quiet) ends with kError whose status keeps the reason
// kSenderFenced and names the sender: the coordinator routes it again without that sender, and
// a client is told 503 sender_fenced rather than a server error.
TEST(DecodeSchedulerQuarantine, WaitingRequestOfAFencedSenderFailsWithTheReason) {
  DecodeHarness h;
  ASSERT_TRUE(h.Init({.kv_quarantine_bound = absl::Milliseconds(200)}).ok());
  const std::vector<int32_t> prompt = h.Encode("a sender that stops answering");
  auto abandoned = h.scheduler().Reserve(h.Args("q", prompt, {.max_tokens = 4}));
  ASSERT_TRUE(abandoned.ok()) << abandoned.status();
  ASSERT_TRUE(h.Prefill(prompt, {.max_tokens = 4}, *abandoned, /*layers_to_send=*/1).ok());
  auto waiting = h.scheduler().Reserve(h.Args("w", prompt, {.max_tokens = 4}));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  auto stream = h.scheduler().Subscribe("w");
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_TRUE(h.scheduler().Release("q").found);  // quarantined; the sender never answers
  std::vector<DecodeEvent> events = DrainStream(**stream, absl::Seconds(5));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish, FinishReason::kError);
  const absl::Status& error = events[0].error;
  EXPECT_EQ(error.code(), absl::StatusCode::kUnavailable) << error;
  EXPECT_EQ(ReasonOf(error), ErrorReason::kSenderFenced) << error;
  EXPECT_NE(error.message().find("sender 'prefill-0' was fenced"), absl::string_view::npos)
      << error;
  EXPECT_EQ(h.scheduler().quarantine_stats().fenced_senders, 1);
  // The sender answers: the fence lifts and every block comes back.
  EXPECT_TRUE(Eventually(
      [&] {
        h.sender().ServeQuietRequests();
        return h.scheduler().quarantine_stats().fenced_senders == 0 && AllFree(h);
      },
      absl::Seconds(5)));
}

}  // namespace
}  // namespace duet::decode
