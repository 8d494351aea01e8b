// Loopback cluster tests under faults and pressure: killed, hung and paused nodes, full pools,
// prompts that never fit, mismatched layouts, and the sampling parameters across a resume;
// requests finish token-exact (invariant 1), nothing leaks (3), every wait has a deadline (5).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/error_reason.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/http_exchange.h"

namespace duet {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture's helpers

class ClusterFailureTest : public ClusterTest {
 protected:
  void StoppedPrefillNodeServesAgainOnceItsFenceLifts(int prefill, int decode);
  // Four requests (prompts of 40 tokens, request i sampled with params(i)) admitted together:
  // decode-0 is paused until the coordinator holds all four (their Reserves wait on it), so
  // that they grow together whatever the machine's load.
  std::vector<Result> RunFourTogether(ServeProcess& cluster, v1::Generation::Stub& stub,
                                      const std::function<model::SamplingParams(int)>& params);
};

// Continues a stopped process when it goes out of scope (a stopped child cannot be shut down).
class Stopped {
 public:
  explicit Stopped(pid_t pid) : pid_(pid) { kill(pid_, SIGSTOP); }
  ~Stopped() { Resume(); }
  void Resume() {
    if (pid_ > 0) kill(pid_, SIGCONT);
    pid_ = 0;
  }

 private:
  pid_t pid_;
};

std::vector<Result> ClusterFailureTest::RunFourTogether(
    ServeProcess& cluster, v1::Generation::Stub& stub,
    const std::function<model::SamplingParams(int)>& params) {
  std::vector<std::thread> threads;
  std::vector<Result> results(4);
  Stopped paused(cluster.pid_of("decode-0"));
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = Generate(stub, Prompt(40, i), rpc::ToProto(params(i))); });
  }
  // Well within the heartbeat timeout (1.5 s).
  int held = 0;
  for (const absl::Time until = absl::Now() + absl::Milliseconds(800);
       (held = Health(stub).running_requests()) < 4 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  paused.Resume();
  EXPECT_EQ(held, 4) << "the coordinator did not take all four requests while decode-0 paused";
  for (auto& t : threads) t.join();
  return results;
}

// Kill a decode node mid-stream: its requests continue on the other decode node from the prompt
// and the tokens already streamed, with no error, no repeated and no missing token (greedy and
// seeded equal the single-process run), within the deadline, and nothing leaks on the survivors.
TEST_F(ClusterFailureTest, KilledDecodeNodesRequestsContinueElsewhereTokenExact) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 1, 2));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  std::atomic<int> streaming{0};
  std::vector<std::thread> threads;
  std::vector<Result> results(6);
  auto params = [](int i) {
    // Long enough that every request still runs when the node is killed.
    model::SamplingParams p{.max_tokens = 1500 + 10 * i, .ignore_eos = true};
    if (i % 3 == 0) {
      p.temperature = 0.8f;
      p.seed = 77 + i;
    }
    return p;
  };
  const absl::Time start = absl::Now();
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      const v1::SamplingParams s = rpc::ToProto(params(i));
      results[i] =
          Generate(*stub, Prompt(50, i), s, absl::Seconds(60), [&](grpc::ClientContext&, int n) {
            if (n == 2) streaming++;
          });
    });
  }
  while (streaming.load() < 6 && absl::Now() - start < absl::Seconds(30)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  // Kill the decode node running the most requests (as its heartbeats report them).
  std::string victim;
  for (const absl::Time until = absl::Now() + absl::Seconds(5);
       victim.empty() && absl::Now() < until; absl::SleepFor(absl::Milliseconds(20))) {
    int most = 0;
    const v1::HealthResponse h = Health(*stub);
    for (const v1::NodeStatus& n : h.nodes()) {
      if (n.kind() == v1::NODE_KIND_DECODE && n.load().running_requests() > most) {
        most = n.load().running_requests();
        victim = n.node_id();
      }
    }
  }
  ASSERT_FALSE(victim.empty()) << "no decode node reported a running request";
  ASSERT_GT(cluster.pid_of(victim), 0);
  kill(cluster.pid_of(victim), SIGKILL);
  for (auto& t : threads) t.join();
  int resumed = 0;
  for (int i = 0; i < 6; ++i) {
    const Result& r = results[i];
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status;
    EXPECT_EQ(r.ids, Reference(Prompt(50, i), params(i))) << i;
    resumed += r.timings.resumes();
  }
  EXPECT_GT(resumed, 0) << "no request was on the killed decode node";
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "requests did not end within the deadline";
  EXPECT_TRUE(EverythingFree(*stub));
}

// A decode pool too small for the requests in flight (20 blocks, four requests that grow to 10
// each): the decode node preempts the newest and the coordinator re-prefills it (prompt and
// tokens so far) and continues its stream. Every request finishes with the single-process
// tokens (greedy and seeded, with and without penalties), and nothing is held afterwards. The
// decode node is paused until the coordinator holds all four (their Reserves wait on it), so
// that all four are admitted together and grow together whatever the machine's load: run one
// after another, they would fit.
TEST_F(ClusterFailureTest, FullDecodePoolPreemptsAndResumesTokenExact) {
  ServeProcess cluster(DUET_BIN,
                       ClusterFlags(model_dir_, "shm", 1, 1, {"--kv_cache_bytes=163840"}));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  auto params = [](int i) {
    model::SamplingParams p{.max_tokens = 120, .ignore_eos = true};
    if (i % 2) {
      p.temperature = 0.9f;
      p.seed = 11 + i;
    }
    if (i >= 2) {  // the resumed prefill and decode count the streamed tokens as output
      p.repetition_penalty = 1.2f;
      p.presence_penalty = 0.5f;
      p.frequency_penalty = 0.3f;
      p.min_p = 0.02f;
    }
    return p;
  };
  const std::vector<Result> results = RunFourTogether(cluster, *stub, params);
  int resumed = 0;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status;
    EXPECT_EQ(results[i].ids, Reference(Prompt(40, i), params(i))) << i;
    resumed += results[i].timings.resumes();
  }
  EXPECT_GT(resumed, 0) << "the pool was expected to force a preemption";
  EXPECT_TRUE(EverythingFree(*stub));
}

// Structured output through preemption: the same full decode pool, each request under a
// grammar (a regex, a JSON schema) that keeps it generating past the pool. A preempted request
// is re-prefilled with the tokens it streamed, each node's matcher replays them, and it ends
// where the grammar ends: every answer is the single-process tokens and still matches.
TEST_F(ClusterFailureTest, ResumedMidGrammarStaysValidAndTokenExact) {
  ServeProcess cluster(DUET_BIN,
                       ClusterFlags(model_dir_, "shm", 1, 1, {"--kv_cache_bytes=163840"}));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  auto params = [](int i) {
    model::SamplingParams p{.max_tokens = 220};
    if (i % 2) {
      p.temperature = 0.9f;
      p.seed = 21 + i;
    }
    p.grammar = i < 2 ? grammar::GrammarSpec::Regex("[a-p]{110}")
                      : grammar::GrammarSpec::JsonSchema(
                            R"({"type": "object", "properties": {"word": {"type": "string",
                                "pattern": "^[a-p]{60}$"}}, "required": ["word"],
                                "additionalProperties": false})");
    return p;
  };
  // Each spec compiled once everywhere (coordinator, prefill and decode node) before decode-0
  // is paused, so that a loaded machine's compiles do not keep the four from reaching it.
  for (int i : {0, 2}) {
    model::SamplingParams warm = params(i);
    warm.max_tokens = 2;
    const Result r = Generate(*stub, Prompt(8, 9), rpc::ToProto(warm));
    ASSERT_TRUE(r.status.ok()) << r.status;
  }
  const std::vector<Result> results = RunFourTogether(cluster, *stub, params);
  int resumed = 0;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status;
    const std::vector<int32_t> want = Reference(Prompt(40, i), params(i));
    EXPECT_EQ(results[i].ids, want) << i;
    resumed += results[i].timings.resumes();
    // The byte tokenizer: ids below 256 are the text's bytes; the last is EOS.
    ASSERT_FALSE(results[i].ids.empty());
    std::string text;
    for (size_t k = 0; k + 1 < results[i].ids.size(); ++k)
      text += static_cast<char>(results[i].ids[k]);
    if (i < 2) {
      EXPECT_EQ(text.size(), 110u) << text;
      EXPECT_EQ(text.find_first_not_of("abcdefghijklmnop"), std::string::npos) << text;
    } else {
      const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
      ASSERT_TRUE(!j.is_discarded() && j.is_object() && j.contains("word")) << text;
      EXPECT_EQ(j["word"].get<std::string>().size(), 60u) << text;
    }
  }
  EXPECT_GT(resumed, 0) << "the pool was expected to force a preemption";
  EXPECT_TRUE(EverythingFree(*stub));
}

class ClusterSamplingTest : public ClusterTest {};

// min_p, the penalties, logit_bias and min_tokens give the single-process tokens on the cluster
// (the prefill node samples the first token, the decode node the rest, each from the prompt and
// the output so far), greedy and seeded, concurrently, and each changes the tokens.
TEST_F(ClusterSamplingTest, SamplingParametersAreTokenExactAgainstOneProcess) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 1, 1));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  const std::vector<int> lengths = {3, 17, 40, 300};
  auto params = [&](int i) {
    model::SamplingParams p{.max_tokens = 24, .ignore_eos = true};
    if (i % 2) {
      p.temperature = 0.9f;
      p.seed = 500 + i;
    }
    switch (i % 4) {
      case 0:
        p.repetition_penalty = 1.5f;
        break;
      case 1:
        p.presence_penalty = 1.f;
        p.frequency_penalty = 0.7f;
        p.min_p = 0.05f;
        break;
      case 2: {
        // The greedy first token is banned; a stop token boosted to come at once waits for
        // min_tokens.
        const int32_t first = Reference(Prompt(lengths[i / 4 % 4], i), p)[0];
        const int32_t stop = (first + 1) % 256;
        p.logit_bias = {{std::min(first, stop), 0.f}, {std::max(first, stop), 0.f}};
        for (compute::LogitBias& b : p.logit_bias) b.bias = b.id == first ? -100.f : 30.f;
        p.stop_token_ids = {stop};
        p.min_tokens = 5;
        break;
      }
      default:
        p.repetition_penalty = 0.8f;
        p.frequency_penalty = -0.5f;
        p.top_k = 40;
        break;
    }
    return p;
  };
  const int n = static_cast<int>(lengths.size()) * 4;
  std::vector<model::SamplingParams> ps;
  for (int i = 0; i < n; ++i) ps.push_back(params(i));
  std::vector<std::thread> threads;
  std::vector<Result> results(n);
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      results[i] = Generate(*stub, Prompt(lengths[i / 4 % 4], i), rpc::ToProto(ps[i]));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE(i);
    const Result& r = results[i];
    ASSERT_TRUE(r.status.ok()) << r.status;
    const std::vector<int32_t> prompt = Prompt(lengths[i / 4 % 4], i);
    EXPECT_EQ(r.ids, Reference(prompt, ps[i]));
    model::SamplingParams plain = ps[i];
    plain.repetition_penalty = 1.f;
    plain.presence_penalty = plain.frequency_penalty = plain.min_p = 0.f;
    plain.logit_bias.clear();
    plain.min_tokens = 0;
    EXPECT_NE(r.ids, Reference(prompt, plain)) << "the parameters changed nothing";
    if (i % 4 == 2) {  // the stop token came right after min_tokens
      EXPECT_EQ(r.ids.size(), 6u);
      EXPECT_EQ(r.ids.back(), ps[i].stop_token_ids[0]);
    }
  }
  EXPECT_TRUE(EverythingFree(*stub));
}

// The cluster advertises what its pools can hold for one request (20 blocks of 16 = 320
// tokens), and a request longer than that is refused at once, naming the numbers, instead of
// failing mid-stream or being refused as retryable.
TEST_F(ClusterFailureTest, RequestThatCanNeverFitIsRefusedNamingMaxModelLen) {
  ServeProcess cluster(DUET_BIN,
                       ClusterFlags(model_dir_, "shm", 1, 1, {"--kv_cache_bytes=163840"}));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  EXPECT_EQ(Health(*stub).max_model_len(), 320);
  v1::SamplingParams s;
  s.set_max_tokens(100);
  Result r = Generate(*stub, Prompt(250, 1), s);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << r.status;
  EXPECT_NE(r.status.message().find("exceeds max_model_len 320"), std::string::npos) << r.status;
  s.set_max_tokens(70);
  r = Generate(*stub, Prompt(250, 1), s);  // exactly 320
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(EverythingFree(*stub));
}

// Prompts that do not all fit the pools at once (six of 16 blocks, pools of 20) wait for room
// on the coordinator and the prefill node instead of failing, and all finish token-exact.
TEST_F(ClusterFailureTest, PromptsBeyondThePoolsWaitForRoomAndFinish) {
  ServeProcess cluster(DUET_BIN,
                       ClusterFlags(model_dir_, "shm", 1, 1, {"--kv_cache_bytes=163840"}));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  std::vector<std::thread> threads;
  std::vector<Result> results(6);
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      v1::SamplingParams s;
      s.set_max_tokens(4);
      s.set_ignore_eos(true);
      results[i] = Generate(*stub, Prompt(250, 10 + i), s);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status;
    EXPECT_EQ(results[i].ids, Reference(Prompt(250, 10 + i), {.max_tokens = 4, .ignore_eos = true}))
        << i;
  }
  EXPECT_TRUE(EverythingFree(*stub));
}

// A decode node killed just before a burst: Reserves that fail on it are re-routed to the
// healthy one at once (it is suspect from then on), long before its heartbeat deadline.
TEST_F(ClusterFailureTest, ReserveOnADeadDecodeNodeIsReRouted) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 1, 2));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  kill(cluster.pid_of("decode-0"), SIGKILL);
  std::vector<std::thread> threads;
  std::vector<Result> results(16);
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      v1::SamplingParams s;
      s.set_max_tokens(4);
      s.set_ignore_eos(true);
      results[i] = Generate(*stub, Prompt(20, i), s);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status;
    EXPECT_EQ(results[i].ids, Reference(Prompt(20, i), {.max_tokens = 4, .ignore_eos = true}));
  }
  EXPECT_TRUE(EverythingFree(*stub));
}

// A hung prefill node (SIGSTOP): requests routed to it are retried on the other one once it is
// declared dead, and the retry does not wait for the abandoned call (which would end only at
// the 60 s prefill deadline).
TEST_F(ClusterFailureTest, HungPrefillNodeIsRetriedWithoutWaitingForTheAbandonedCall) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 2, 1));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  // First a few requests, so that the decode node is connected to prefill-0 (ties go to it):
  // then a Reserve naming it succeeds, and the Prefill call to it is what hangs.
  for (int i = 0; i < 3; ++i) {
    v1::SamplingParams s;
    s.set_max_tokens(2);
    ASSERT_TRUE(Generate(*stub, Prompt(30, 90 + i), s).status.ok());
  }
  Stopped hung(cluster.pid_of("prefill-0"));
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  std::vector<Result> results(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      v1::SamplingParams s;
      s.set_max_tokens(4);
      s.set_ignore_eos(true);
      results[i] = Generate(*stub, Prompt(30, i), s, absl::Seconds(30));
    });
  }
  for (auto& t : threads) t.join();
  const absl::Duration took = absl::Now() - start;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status;
    EXPECT_EQ(results[i].ids, Reference(Prompt(30, i), {.max_tokens = 4, .ignore_eos = true}));
  }
  EXPECT_LT(took, absl::Seconds(12)) << "the retries waited for the hung node's calls";
  hung.Resume();
}

// Fenced prefill nodes on every decode node, per the coordinator's view of the heartbeats.
std::vector<std::string> FencedPairs(v1::Generation::Stub& stub) {
  const v1::HealthResponse h = Health(stub);
  return {h.fenced_pairs().begin(), h.fenced_pairs().end()};
}
int FencedSenders(v1::Generation::Stub& stub) {
  int n = 0;
  const v1::HealthResponse h = Health(stub);
  for (const v1::NodeStatus& s : h.nodes()) n += s.load().fenced_senders_size();
  return n;
}

// A prefill node stopped past --kv_quarantine_bound while the decode node(s) waited for its KV is
// fenced (seen in the decode nodes' heartbeats); once it runs again it confirms the abandoned
// transfers quiet, the fence lifts within a few heartbeats, and the pair serves again. Before
// fences were scoped, the pair stayed cut off until the prefill process restarted.
void ClusterFailureTest::StoppedPrefillNodeServesAgainOnceItsFenceLifts(int prefill, int decode) {
  ServeProcess cluster(
      DUET_BIN, ClusterFlags(model_dir_, "shm", prefill, decode, {"--kv_quarantine_bound=2s"}));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  v1::SamplingParams s;
  s.set_max_tokens(4);
  s.set_ignore_eos(true);
  // Decode nodes connect to prefill-0 (light load spreads over the pairs).
  for (int i = 0; i < 2 * prefill * decode; ++i) {
    ASSERT_TRUE(Generate(*stub, Prompt(30, 60 + i), s).status.ok());
  }
  Stopped stopped(cluster.pid_of("prefill-0"));
  // Requests routed to prefill-0 before it is declared dead: their decode nodes wait for its KV,
  // then release it (retry) and quarantine the blocks it may still write; it never answers.
  std::vector<std::thread> threads;
  std::vector<Result> during(2 * decode);
  for (int i = 0; i < 2 * decode; ++i) {
    threads.emplace_back(
        [&, i] { during[i] = Generate(*stub, Prompt(30, 80 + i), s, absl::Seconds(20)); });
  }
  const absl::Time fence_deadline = absl::Now() + absl::Seconds(20);
  while (FencedSenders(*stub) == 0 && absl::Now() < fence_deadline) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_GT(FencedSenders(*stub), 0) << "no decode node fenced the stopped prefill node";
  for (const std::string& pair : FencedPairs(*stub)) {
    EXPECT_NE(pair.find("prefill-0"), std::string::npos) << pair;
  }
  stopped.Resume();
  const absl::Time resumed = absl::Now();
  while (FencedSenders(*stub) > 0 && absl::Now() < resumed + absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  const absl::Duration lifted = absl::Now() - resumed;
  EXPECT_EQ(FencedSenders(*stub), 0) << "still fenced 10 s after the prefill node resumed";
  EXPECT_TRUE(FencedPairs(*stub).empty());
  std::printf("fence lifted %.2f s after SIGCONT (%dP/%dD)\n", absl::ToDoubleSeconds(lifted),
              prefill, decode);
  for (auto& t : threads) t.join();
  // Every pair serves again.
  for (int i = 0; i < 2 * prefill * decode; ++i) {
    Result r = Generate(*stub, Prompt(30, i), s);
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status;
    EXPECT_EQ(r.ids, Reference(Prompt(30, i), {.max_tokens = 4, .ignore_eos = true}));
  }
  EXPECT_TRUE(EverythingFree(*stub, absl::Seconds(25)));
}

TEST_F(ClusterFailureTest, StoppedPrefillNodeServesAgainOnceItsFenceLifts1P1D) {
  StoppedPrefillNodeServesAgainOnceItsFenceLifts(1, 1);
}

TEST_F(ClusterFailureTest, StoppedPrefillNodeServesAgainOnceItsFenceLifts2P2D) {
  StoppedPrefillNodeServesAgainOnceItsFenceLifts(2, 2);
}

// A transfer that a fence kills reaches the client as what it is: 503 (UNAVAILABLE on the gRPC
// API) with the reason sender_fenced and a message naming the fence and the sender, never a 500.
// Before, the decode node's FINISH_REASON_ERROR became ABORTED (HTTP 500) without its reason,
// or, when it came before the prefill node's first token, waited for that token until the
// Prefill call broke (15 s) and ended as a plain "unavailable". prefill-0 is stopped (with a
// heartbeat timeout that keeps it live) while two requests wait on decode-0 for its KV, and a
// third is abandoned by its client: decode-0 quarantines that one's blocks and asks prefill-0,
// which does not answer, so past --kv_quarantine_bound decode-0 fences it, which fails the two
// waiting transfers. The coordinator routes each again without prefill-0, and with no other
// prefill node refuses it at once (a short queue_timeout bounds any wait for a fenced pair).
// Once prefill-0 runs again it confirms the transfers quiet, the fence lifts and the pair serves.
TEST_F(ClusterFailureTest, TransferKilledByAFenceIsRefused503NamingTheFence) {
  ServeProcess cluster(DUET_BIN,
                       ClusterFlags(model_dir_, "shm", 1, 1,
                                    {"--kv_quarantine_bound=1s", "--heartbeat_timeout_ms=30000",
                                     "--queue_timeout_ms=2000", "--http_port=0"}));
  ASSERT_TRUE(cluster.ready());
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(cluster.http_url().substr(17), &port)) << cluster.http_url();
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  v1::SamplingParams s;
  s.set_max_tokens(4);
  s.set_ignore_eos(true);
  ASSERT_TRUE(Generate(*stub, Prompt(30, 1), s).status.ok());  // decode-0 connects to prefill-0
  const absl::Time start = absl::Now();
  Stopped stopped(cluster.pid_of("prefill-0"));
  testing::Reply http;
  Result grpc;
  std::thread http_client([&] {
    std::string prompt;
    for (int32_t t : Prompt(30, 2)) absl::StrAppend(&prompt, prompt.empty() ? "" : ",", t);
    http = testing::Exchange(
        port, "POST", "/v1/completions",
        absl::StrCat(R"({"prompt": [)", prompt, R"(], "max_tokens": 4, "ignore_eos": true})"));
  });
  std::thread grpc_client([&] { grpc = Generate(*stub, Prompt(30, 3), s, absl::Seconds(20)); });
  // Both reserved on decode-0 (two blocks each held), waiting for prefill-0's KV.
  v1::HealthResponse h;
  bool reserved = false;
  for (const absl::Time until = absl::Now() + absl::Seconds(5); !reserved && absl::Now() < until;
       absl::SleepFor(absl::Milliseconds(20))) {
    h = Health(*stub);
    reserved = h.running_requests() == 2 &&
               std::all_of(h.nodes().begin(), h.nodes().end(), [](const v1::NodeStatus& n) {
                 return n.kind() != v1::NODE_KIND_DECODE ||
                        n.load().total_blocks() - n.load().free_blocks() >= 4;
               });
  }
  EXPECT_TRUE(reserved) << h.DebugString();
  absl::SleepFor(absl::Milliseconds(200));
  // Abandoned by its client: decode-0 quarantines its blocks and asks prefill-0 to confirm.
  const Result abandoned = Generate(*stub, Prompt(30, 4), s, absl::Milliseconds(500));
  EXPECT_EQ(abandoned.status.code(), absl::StatusCode::kDeadlineExceeded) << abandoned.status;
  http_client.join();
  grpc_client.join();
  const absl::Duration refused = absl::Now() - start;
  EXPECT_EQ(http.status, 503) << http.head << http.body;
  EXPECT_NE(http.body.find(R"("code":"sender_fenced")"), std::string::npos) << http.body;
  EXPECT_NE(http.body.find("prefill-0 (fenced by decode-0"), std::string::npos) << http.body;
  EXPECT_EQ(grpc.status.code(), absl::StatusCode::kUnavailable) << grpc.status;
  EXPECT_EQ(ReasonOf(grpc.status), ErrorReason::kSenderFenced) << grpc.status;
  EXPECT_NE(grpc.status.message().find("prefill-0 (fenced by decode-0"), absl::string_view::npos)
      << grpc.status;
  std::printf("refused %.2f s after SIGSTOP\n", absl::ToDoubleSeconds(refused));

  // decode-0's heartbeat reports the fence, so that its lifting is seen below.
  for (const absl::Time until = absl::Now() + absl::Seconds(5);
       FencedSenders(*stub) == 0 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GT(FencedSenders(*stub), 0) << "decode-0's heartbeat never reported the fence";
  stopped.Resume();
  const absl::Time resumed = absl::Now();
  while (FencedSenders(*stub) > 0 && absl::Now() < resumed + absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(FencedSenders(*stub), 0) << "still fenced 10 s after the prefill node resumed";
  const Result again = Generate(*stub, Prompt(30, 5), s);
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_EQ(again.ids, Reference(Prompt(30, 5), {.max_tokens = 4, .ignore_eos = true}));
  EXPECT_TRUE(EverythingFree(*stub, absl::Seconds(15)));
}

// `serve --loopback` survives its coordinator's death: it starts it again on the same address,
// every node re-registers with it, and requests are served again within a few seconds.
TEST_F(ClusterFailureTest, ServeLoopbackRestartsAKilledCoordinator) {
  std::vector<std::string> flags = ClusterFlags(model_dir_, "shm", 1, 1);
  flags.erase(std::remove(flags.begin(), flags.end(), "--no_restart"), flags.end());
  ServeProcess cluster(DUET_BIN, flags);
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  v1::SamplingParams s;
  s.set_max_tokens(4);
  s.set_ignore_eos(true);
  ASSERT_TRUE(Generate(*stub, Prompt(30, 1), s).status.ok());
  ASSERT_EQ(kill(cluster.pid_of("coordinator"), SIGKILL), 0);
  const absl::Time killed = absl::Now();
  Result r;
  while (absl::Now() < killed + absl::Seconds(30)) {
    const v1::HealthResponse h = Health(*stub);
    if (h.prefill_nodes() == 1 && h.decode_nodes() == 1) {
      r = Generate(*stub, Prompt(30, 2), s, absl::Seconds(10));
      if (r.status.ok()) break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  const absl::Duration took = absl::Now() - killed;
  ASSERT_TRUE(r.status.ok()) << "not served again within 30 s of the kill: " << r.status;
  std::printf("served again %.2f s after kill -9 of the coordinator\n",
              absl::ToDoubleSeconds(took));
  EXPECT_LT(took, absl::Seconds(10));
  EXPECT_EQ(r.ids, Reference(Prompt(30, 2), {.max_tokens = 4, .ignore_eos = true}));
  EXPECT_TRUE(EverythingFree(*stub));
}

// A hung decode node (SIGSTOP): a Reserve to it times out (5 s), and the request is re-routed to
// the other decode node: the tracker's deadline outlasts the RPC, so the request is still there.
TEST_F(ClusterFailureTest, ReserveOnAHungDecodeNodeTimesOutAndIsReRouted) {
  ServeProcess cluster(DUET_BIN,
                       ClusterFlags(model_dir_, "shm", 1, 2, {"--heartbeat_timeout_ms=30000"}));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  Stopped hung(cluster.pid_of("decode-0"));
  std::vector<std::thread> threads;
  std::vector<Result> results(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      v1::SamplingParams s;
      s.set_max_tokens(4);
      s.set_ignore_eos(true);
      results[i] = Generate(*stub, Prompt(30, 20 + i), s, absl::Seconds(40));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status;
    EXPECT_EQ(results[i].ids, Reference(Prompt(30, 20 + i), {.max_tokens = 4, .ignore_eos = true}));
  }
  hung.Resume();
}

// A bounded soak at saturation: 2 prefill and 2 decode nodes with 20-block pools, 40 requests
// of mixed lengths from 8 clients (greedy and seeded), one decode node killed and one prefill
// node paused for 3 s (past its heartbeat deadline) mid-run. Every request finishes with the
// single-process tokens, and afterwards no block is held or quarantined on any live node. The
// preemptions and what they cost are printed (docs/benchmarks.md quotes them).
TEST_F(ClusterFailureTest, SoakAtSaturationWithAKilledAndAPausedNodeLosesNothing) {
  ServeProcess cluster(DUET_BIN,
                       ClusterFlags(model_dir_, "shm", 2, 2, {"--kv_cache_bytes=163840"}));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  constexpr int kRequests = 40, kClients = 8;
  auto prompt_len = [](int i) { return 10 + (i * 37) % 80; };
  auto params = [](int i) {
    model::SamplingParams p{.max_tokens = 10 + (i * 53) % 80, .ignore_eos = true};
    if (i % 2) {
      p.temperature = 0.8f;
      p.seed = 500 + i;
    }
    return p;
  };
  std::vector<Result> results(kRequests);
  std::atomic<int> next{0}, done{0};
  std::vector<std::thread> clients;
  const absl::Time start = absl::Now();
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&] {
      for (int i = next++; i < kRequests; i = next++) {
        const v1::SamplingParams s = rpc::ToProto(params(i));
        results[i] = Generate(*stub, Prompt(prompt_len(i), 100 + i), s, absl::Seconds(120));
        done++;
      }
    });
  }
  while (done.load() < kRequests / 4 && absl::Now() - start < absl::Seconds(60)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  kill(cluster.pid_of("decode-1"), SIGKILL);
  {
    Stopped paused(cluster.pid_of("prefill-1"));
    absl::SleepFor(absl::Seconds(3));
  }
  for (auto& t : clients) t.join();
  int resumes = 0, resumed_requests = 0;
  int64_t resume_us = 0;
  std::vector<int64_t> ttft_us;
  for (int i = 0; i < kRequests; ++i) {
    const Result& r = results[i];
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status;
    EXPECT_EQ(r.ids, Reference(Prompt(prompt_len(i), 100 + i), params(i))) << i;
    resumes += r.timings.resumes();
    resumed_requests += r.timings.resumes() > 0;
    resume_us += r.timings.resume_us();
    ttft_us.push_back(r.timings.time_to_first_token_us());
  }
  std::sort(ttft_us.begin(), ttft_us.end());
  std::printf(
      "soak: %d requests in %.1f s, 0 failed; %d resumes over %d requests, %.1f ms each on "
      "average (stream stopped -> next token); TTFT p50 %.1f ms, p90 %.1f ms\n",
      kRequests, absl::ToDoubleSeconds(absl::Now() - start), resumes, resumed_requests,
      resumes ? resume_us / 1e3 / resumes : 0.0, ttft_us[kRequests / 2] / 1e3,
      ttft_us[kRequests * 9 / 10] / 1e3);
  EXPECT_GT(resumes, 0);
  // Blocks the paused prefill node was writing stay quarantined until it answers that it is
  // quiet, or for up to --kv_quarantine_bound (10 s) before it is fenced: a quarantine that began
  // near the end of the run may need all of it, and a loaded machine a few heartbeats more.
  EXPECT_TRUE(EverythingFree(*stub, absl::Seconds(25)));
}

// Kill a prefill node: a request routed to it is retried once on the other and finishes.
TEST_F(ClusterFailureTest, KilledPrefillNodeIsRetriedElsewhere) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 2, 1));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  kill(cluster.pid_of("prefill-0"), SIGKILL);
  v1::SamplingParams s;
  s.set_max_tokens(6);
  s.set_ignore_eos(true);
  for (int i = 0; i < 4; ++i) {
    Result r = Generate(*stub, Prompt(64, i), s);
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.ids, Reference(Prompt(64, i), {.max_tokens = 6, .ignore_eos = true}));
  }
  EXPECT_TRUE(EverythingFree(*stub));
}

// A decode node whose KV layout differs from the cluster's is refused at registration, and the
// message names both layouts.
TEST_F(ClusterFailureTest, MismatchedLayoutIsRefusedAtRegistration) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 1, 1));
  ASSERT_TRUE(cluster.ready());
  ChildProcess decode(
      {DUET_BIN, "decode", "--coordinator=" + cluster.address(), "--model=" + model_dir_,
       "--node_id=decode-odd", "--block_size=32", "--threads=1", "--kv_cache_bytes=8388608"},
      {.merge_stderr = true});
  const std::string out = decode.ReadAll(absl::Now() + absl::Seconds(60));
  EXPECT_GT(decode.Wait(absl::Seconds(10)), 0) << out;
  EXPECT_NE(out.find("block=16"), std::string::npos) << out;
  EXPECT_NE(out.find("block=32"), std::string::npos) << out;
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  EXPECT_EQ(Health(*stub).decode_nodes(), 1);
}

// A decode node whose KV dtype differs from the cluster's is refused at registration, naming
// both dtypes (an int8 block with its scales is not an f32 block).
TEST_F(ClusterFailureTest, MismatchedKvDtypeIsRefusedAtRegistration) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 1, 1));
  ASSERT_TRUE(cluster.ready());
  ChildProcess decode(
      {DUET_BIN, "decode", "--coordinator=" + cluster.address(), "--model=" + model_dir_,
       "--node_id=decode-int8", "--kv_dtype=int8", "--threads=1", "--kv_cache_bytes=8388608"},
      {.merge_stderr = true});
  const std::string out = decode.ReadAll(absl::Now() + absl::Seconds(60));
  EXPECT_GT(decode.Wait(absl::Seconds(10)), 0) << out;
  EXPECT_NE(out.find("dtype=f32"), std::string::npos) << out;
  EXPECT_NE(out.find("dtype=int8 scales=f32/token/head"), std::string::npos) << out;
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  EXPECT_EQ(Health(*stub).decode_nodes(), 1);
}

}  // namespace
}  // namespace duet
