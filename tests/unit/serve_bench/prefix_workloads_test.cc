#include "bench/serve_bench/prefix_workloads.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>

#include "bench/serve_bench/runner.h"
#include "common/base/clock.h"

namespace duet::bench {
namespace {

SharedPrefixOptions Shared() {
  return {.prefix_len = 64, .num_prefixes = 3, .suffix = {4, 9}, .output = {2, 2}};
}

MultiTurnOptions Chats(int sessions, int turns) {
  return {.num_sessions = sessions, .turns = turns, .turn_len = {3, 7}, .output = {2, 5}};
}

// What a fake server "generates" for a prompt: a function of the prompt alone (as greedy
// decoding is), so runs repeat.
std::vector<int32_t> FakeOutput(const std::vector<int32_t>& prompt, int n) {
  std::vector<int32_t> out;
  int32_t h = static_cast<int32_t>(prompt.size());
  for (int32_t id : prompt) h = h * 31 + id;
  for (int i = 0; i < n; ++i) out.push_back(1000 + ((h + i) & 0xff));
  return out;
}

TEST(WorkloadKindTest, ParsesTheThreeAndRefusesOthersByName) {
  WorkloadKind k;
  ASSERT_TRUE(ParseWorkloadKind("random", &k).ok());
  EXPECT_EQ(k, WorkloadKind::kRandom);
  ASSERT_TRUE(ParseWorkloadKind("shared_prefix", &k).ok());
  EXPECT_EQ(k, WorkloadKind::kSharedPrefix);
  ASSERT_TRUE(ParseWorkloadKind("multi_turn", &k).ok());
  EXPECT_EQ(k, WorkloadKind::kMultiTurn);
  const absl::Status st = ParseWorkloadKind("sharegpt", &k);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'sharegpt'"), absl::string_view::npos) << st;
}

TEST(SharedPrefixTest, SameSeedSameRequestsOtherSeedOthers) {
  SharedPrefixSource a(Shared(), 7, "main"), b(Shared(), 7, "main"), c(Shared(), 8, "main");
  bool differs = false;
  for (int i = 0; i < 20; ++i) {
    const RequestSpec ra = a.Next(), rb = b.Next(), rc = c.Next();
    EXPECT_EQ(ra.token_ids, rb.token_ids);
    EXPECT_EQ(ra.prefix_group, rb.prefix_group);
    EXPECT_EQ(ra.max_tokens, rb.max_tokens);
    if (ra.token_ids != rc.token_ids) differs = true;
  }
  EXPECT_TRUE(differs);
}

TEST(SharedPrefixTest, EveryPromptIsOneOfTheFixedPrefixesPlusAFreshSuffix) {
  const SharedPrefixOptions o = Shared();
  SharedPrefixSource src(o, 3, "main");
  for (int i = 0; i < o.num_prefixes; ++i) {
    ASSERT_EQ(src.prefix(i).size(), 64u);
    for (int j = 0; j < i; ++j) EXPECT_NE(src.prefix(i), src.prefix(j));
  }
  std::set<int> groups;
  std::set<std::vector<int32_t>> suffixes;
  for (int i = 0; i < 60; ++i) {
    const RequestSpec r = src.Next();
    ASSERT_GE(r.prefix_group, 0);
    ASSERT_LT(r.prefix_group, o.num_prefixes);
    groups.insert(r.prefix_group);
    const std::vector<int32_t>& p = src.prefix(r.prefix_group);
    ASSERT_GE(r.token_ids.size(), p.size() + 4);
    ASSERT_LE(r.token_ids.size(), p.size() + 9);
    EXPECT_TRUE(std::equal(p.begin(), p.end(), r.token_ids.begin()));
    EXPECT_EQ(r.new_tokens, static_cast<int>(r.token_ids.size() - p.size()));
    for (int32_t id : r.token_ids) {
      EXPECT_GE(id, o.min_token_id);
      EXPECT_LE(id, o.max_token_id);
    }
    suffixes.emplace(r.token_ids.begin() + p.size(), r.token_ids.end());
  }
  EXPECT_EQ(groups.size(), 3u);     // every prefix is used
  EXPECT_GT(suffixes.size(), 50u);  // suffixes are fresh
}

TEST(MultiTurnTest, EachTurnIsThePreviousPromptItsOutputAndANewMessage) {
  MultiTurnWorkload w(Chats(2, 4), 5, "main");
  std::vector<std::vector<int32_t>> expected_start(2);  // previous prompt + its output
  std::vector<int> next_turn(2, 0);
  int taken = 0;
  while (std::optional<RequestSpec> t = w.Take()) {
    ++taken;
    ASSERT_GE(t->session, 0);
    ASSERT_LT(t->session, 2);
    EXPECT_EQ(t->turn, next_turn[t->session]++);
    const std::vector<int32_t>& start = expected_start[t->session];
    ASSERT_GT(t->token_ids.size(), start.size());
    EXPECT_TRUE(std::equal(start.begin(), start.end(), t->token_ids.begin()))
        << "session " << t->session << " turn " << t->turn;
    EXPECT_EQ(t->new_tokens, static_cast<int>(t->token_ids.size() - start.size()));
    EXPECT_GE(t->new_tokens, 3);
    EXPECT_LE(t->new_tokens, 7);
    const std::vector<int32_t> out = FakeOutput(t->token_ids, t->max_tokens);
    expected_start[t->session] = t->token_ids;
    expected_start[t->session].insert(expected_start[t->session].end(), out.begin(), out.end());
    w.Finish(*t, true, out);
  }
  EXPECT_EQ(taken, 8);
  EXPECT_EQ(next_turn, (std::vector<int>{4, 4}));
  EXPECT_EQ(w.abandoned_turns(), 0);
}

TEST(MultiTurnTest, ASessionsMessagesDependOnTheSeedAndItsIdAlone) {
  // Session 1 alone gives the same prompts as session 1 among others: what the other sessions
  // draw, and when they are served, does not change its messages.
  auto run_workload = [](uint64_t seed) {
    MultiTurnWorkload w(Chats(3, 3), seed, "main");
    std::vector<std::vector<int32_t>> prompts;
    while (std::optional<RequestSpec> t = w.Take()) {
      if (t->session == 1) prompts.push_back(t->token_ids);
      w.Finish(*t, true, FakeOutput(t->token_ids, t->max_tokens));
    }
    return prompts;
  };
  ChatSession alone(1, Chats(3, 3), 11);
  std::vector<std::vector<int32_t>> prompts_alone;
  for (int turn = 0; turn < 3; ++turn) {
    const RequestSpec t = alone.MakeTurn("main");
    prompts_alone.push_back(t.token_ids);
    alone.Finish(FakeOutput(t.token_ids, t.max_tokens));
  }
  const auto a = run_workload(11), b = run_workload(11), c = run_workload(12);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, prompts_alone);
  EXPECT_NE(a, c);
}

TEST(MultiTurnTest, AFailedTurnAbandonsTheRestOfItsSession) {
  MultiTurnWorkload w(Chats(2, 3), 1, "main");
  int sent = 0;
  while (std::optional<RequestSpec> t = w.Take()) {
    ++sent;
    const bool fail = t->session == 0 && t->turn == 1;
    w.Finish(*t, !fail, fail ? std::vector<int32_t>{} : FakeOutput(t->token_ids, 2));
  }
  EXPECT_EQ(sent, 5);  // session 0: turns 0 and 1 (failed); session 1: all 3
  EXPECT_EQ(w.abandoned_turns(), 1);
}

// Streams max_tokens ids (FakeOutput) after `ms` milliseconds; tracks the sessions in flight.
class EchoClient : public Client {
 public:
  RequestRecord Send(const RequestSpec& spec, absl::Duration, CancelScope*) override {
    RequestRecord r;
    StampRecord(spec, r);
    r.requested_prompt_tokens = static_cast<int>(spec.token_ids.size());
    {
      absl::MutexLock lock(&mu_);
      EXPECT_TRUE(in_flight_.insert(spec.session).second)
          << "session " << spec.session << " has two turns in flight";
      max_in_flight_ = std::max<int>(max_in_flight_, in_flight_.size());
      prompts_[{spec.session, spec.turn}] = spec.token_ids;
    }
    r.send_ns = MonotonicNanos();
    absl::SleepFor(absl::Milliseconds(3));
    r.output_ids = FakeOutput(spec.token_ids, spec.max_tokens);
    for (size_t i = 0; i < r.output_ids.size(); ++i) r.token_ns.push_back(MonotonicNanos());
    r.end_ns = MonotonicNanos();
    absl::MutexLock lock(&mu_);
    in_flight_.erase(spec.session);
    return r;
  }
  absl::Status WaitReady(absl::Duration) override { return absl::OkStatus(); }

  absl::Mutex mu_;
  std::set<int> in_flight_ ABSL_GUARDED_BY(mu_);
  int max_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::pair<int, int>, std::vector<int32_t>> prompts_ ABSL_GUARDED_BY(mu_);
};

TEST(RunSessionsTest, SendsEveryTurnFeedingEachOutputBackAtMostConcurrencyAtOnce) {
  EchoClient client;
  MultiTurnWorkload w(Chats(5, 3), 2, "main");
  const RunResult r = RunSessions(client, {.concurrency = 3}, w, nullptr);
  ASSERT_EQ(r.records.size(), 15u);
  EXPECT_EQ(r.abandoned_turns, 0);
  absl::MutexLock lock(&client.mu_);
  EXPECT_LE(client.max_in_flight_, 3);
  EXPECT_GE(client.max_in_flight_, 2);
  for (const RequestRecord& rec : r.records) {
    EXPECT_TRUE(rec.ok());
    if (rec.turn + 1 >= 3) continue;
    // The session's next prompt starts with this prompt and the ids this turn streamed.
    std::vector<int32_t> start = client.prompts_[{rec.session, rec.turn}];
    start.insert(start.end(), rec.output_ids.begin(), rec.output_ids.end());
    const std::vector<int32_t>& next = client.prompts_[{rec.session, rec.turn + 1}];
    ASSERT_GT(next.size(), start.size());
    EXPECT_TRUE(std::equal(start.begin(), start.end(), next.begin()));
  }
}

}  // namespace
}  // namespace duet::bench
