// The loopback cluster the integration tests start: `duet serve --loopback` with a coordinator,
// prefill and decode nodes as real processes, a gRPC client for it, the in-process engine as the
// reference (invariant 1), and the "everything free" check (invariant 3). One fixture, shared by
// cluster_test.cc (the paths that work) and cluster_failure_test.cc (faults and pressure).
//
//   class MyClusterTest : public ClusterTest {};
//   TEST_F(MyClusterTest, X) {
//     ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 1, 1));
//     auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
//     Result r = Generate(*stub, Prompt(20, 1), sampling);
//     EXPECT_EQ(r.ids, Reference(Prompt(20, 1), params));
//     EXPECT_TRUE(EverythingFree(*stub));
//   }
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/auto_option.h"
#include "common/engine/local_engine.h"
#include "common/grammar/grammar_compiler.h"
#include "common/grammar/grammar_constraint.h"
#include "common/model/synthetic_model.h"
#include "duet/v1/client.grpc.pb.h"
#include "proto/channel.h"
#include "proto/sampling_convert.h"
#include "proto/status_util.h"
#include "tests/integration/child_process.h"
#include "tests/integration/serve_process.h"

#ifndef DUET_BIN
#error "DUET_BIN must point at the duet binary"
#endif

namespace duet::cluster_testing {

namespace fs = std::filesystem;
using testing::ChildProcess;
using testing::ServeProcess;

// `duet serve --loopback` flags for a cluster of `prefill` and `decode` nodes on `transport`.
inline std::vector<std::string> ClusterFlags(const std::string& model_dir,
                                             const std::string& transport, int prefill, int decode,
                                             const std::vector<std::string>& extra = {}) {
  std::vector<std::string> flags = {"--loopback", absl::StrCat("--prefill=", prefill),
                                    absl::StrCat("--decode=", decode), "--model=" + model_dir,
                                    "--transport=" + transport, "--threads=1",
                                    "--kv_cache_bytes=16777216", "--heartbeat_timeout_ms=1500",
                                    // A killed child stays down (the tests that kill one check
                                    // what the others do); ServeLoopbackRestarts... drops it.
                                    "--no_restart"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

struct Result {
  absl::Status status;
  std::vector<int32_t> ids;
  v1::RequestTimings timings;
};

inline Result Generate(v1::Generation::Stub& stub, const std::vector<int32_t>& prompt,
                       const v1::SamplingParams& sampling,
                       absl::Duration timeout = absl::Seconds(60),
                       std::function<void(grpc::ClientContext&, int)> on_token = nullptr) {
  v1::GenerateRequest req;
  req.mutable_token_ids()->mutable_ids()->Assign(prompt.begin(), prompt.end());
  *req.mutable_sampling() = sampling;
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, timeout);
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse r;
  Result out;
  while (reader->Read(&r)) {
    if (r.has_token()) out.ids.push_back(r.token_id());
    if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) out.timings = r.timings();
    if (on_token && r.has_token()) on_token(ctx, static_cast<int>(out.ids.size()));
  }
  out.status = rpc::FromGrpcStatus(reader->Finish());
  return out;
}

inline v1::HealthResponse Health(v1::Generation::Stub& stub) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, absl::Seconds(2));
  v1::HealthResponse h;
  (void)stub.Health(&ctx, v1::HealthRequest(), &h);
  return h;
}

// Waits (bounded) until no request is tracked, the directory is empty and every decode node's
// heartbeat reports all blocks free.
inline ::testing::AssertionResult EverythingFree(v1::Generation::Stub& stub,
                                                 absl::Duration within = absl::Seconds(10)) {
  v1::HealthResponse h;
  const absl::Time deadline = absl::Now() + within;
  while (absl::Now() < deadline) {
    h = Health(stub);
    bool free = h.running_requests() == 0 && h.directory_entries() == 0;
    for (const v1::NodeStatus& n : h.nodes()) {
      free = free && n.load().free_blocks() == n.load().total_blocks();
    }
    if (free) return ::testing::AssertionSuccess();
    absl::SleepFor(absl::Milliseconds(100));
  }
  return ::testing::AssertionFailure() << "not everything was freed: " << h.DebugString();
}

class ClusterTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    model_dir_ =
        (fs::temp_directory_path() / absl::StrCat("duet_cluster_test_", getpid())).string();
    ASSERT_TRUE(model::WriteSyntheticModel("tiny", 3, model_dir_).ok());
  }
  static void TearDownTestSuite() { fs::remove_all(model_dir_); }

  std::vector<int32_t> Prompt(int n, int salt) {
    std::vector<int32_t> p(n);
    for (int i = 0; i < n; ++i) p[i] = (i * 31 + salt * 17 + 3) % 256;
    return p;
  }
  // What one process (`duet generate`'s engine) gives, with its KV in `kv_dtype`.
  std::vector<int32_t> Reference(const std::vector<int32_t>& prompt,
                                 const model::SamplingParams& params,
                                 const std::string& kv_dtype = "auto") {
    std::unique_ptr<model::LocalEngine>& engine = engines_[kv_dtype];
    if (!engine) {
      // The flag's name, parsed as `duet generate` parses it.
      auto dtype = ParseOrAuto<kv::KvDtype>(kv_dtype, kv::ParseKvDtype);
      EXPECT_TRUE(dtype.ok()) << dtype.status();
      if (!dtype.ok()) return {};
      auto e = model::LocalEngine::Load(model_dir_, {.device = compute::Device::kCpu,
                                                     .num_threads = 1,
                                                     .kv_cache_bytes = 64 << 20,
                                                     .kv_dtype = *dtype});
      EXPECT_TRUE(e.ok()) << e.status();
      if (!e.ok()) return {};
      engine = std::move(*e);
    }
    // Structured output: the engine samples under the grammar as every node does.
    std::unique_ptr<model::TokenConstraint> constraint;
    if (params.grammar.has_value()) {
      std::unique_ptr<grammar::GrammarCompiler>& compiler = compilers_[kv_dtype];
      if (!compiler) {
        auto c =
            grammar::GrammarCompiler::Create(engine->tokenizer(), engine->config().vocab_size, {});
        EXPECT_TRUE(c.ok()) << c.status();
        if (!c.ok()) return {};
        compiler = std::move(*c);
      }
      auto made = grammar::ConstraintFor(compiler.get(), params, {});
      EXPECT_TRUE(made.ok()) << made.status();
      if (!made.ok()) return {};
      constraint = std::move(*made);
    }
    auto r = engine->Generate(prompt, params, std::move(constraint));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->generated_ids : std::vector<int32_t>();
  }

  void ExpectTokenExactAndEverythingFree(const std::vector<std::string>& extra = {},
                                         const std::string& transport = "",
                                         const std::string& kv_dtype = "auto");

  inline static std::string model_dir_;
  std::map<std::string, std::unique_ptr<model::LocalEngine>> engines_;
  std::map<std::string, std::unique_ptr<grammar::GrammarCompiler>> compilers_;
};

// Invariant 1: greedy and seeded tokens from a 2-prefill/2-decode cluster equal the in-process
// engine's, for prompt lengths crossing block boundaries, with requests running concurrently;
// afterwards nothing is held anywhere.
inline void ClusterTest::ExpectTokenExactAndEverythingFree(const std::vector<std::string>& extra,
                                                           const std::string& transport,
                                                           const std::string& kv_dtype) {
  std::vector<std::string> flags = extra;
  flags.push_back("--kv_dtype=" + kv_dtype);
  ServeProcess cluster(
      DUET_BIN, ClusterFlags(model_dir_, transport.empty() ? GetParam() : transport, 2, 2, flags));
  ASSERT_TRUE(cluster.ready());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  const std::vector<int> lengths = {1, 15, 16, 17, 100, 700, 2000};
  std::vector<std::thread> threads;
  std::vector<Result> results(lengths.size() * 2);
  for (size_t i = 0; i < lengths.size(); ++i) {
    for (int seeded = 0; seeded < 2; ++seeded) {
      threads.emplace_back([&, i, seeded] {
        v1::SamplingParams s;
        s.set_max_tokens(12);
        s.set_ignore_eos(true);
        if (seeded) {
          s.set_temperature(0.8f);
          s.set_top_p(0.9f);
          s.set_seed(1234 + i);
        }
        results[i * 2 + seeded] = Generate(*stub, Prompt(lengths[i], i), s);
      });
    }
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < lengths.size(); ++i) {
    for (int seeded = 0; seeded < 2; ++seeded) {
      const Result& r = results[i * 2 + seeded];
      ASSERT_TRUE(r.status.ok()) << "length " << lengths[i] << ": " << r.status;
      model::SamplingParams p{.max_tokens = 12, .ignore_eos = true};
      if (seeded) {
        p.temperature = 0.8f;
        p.top_p = 0.9f;
        p.seed = 1234 + i;
      }
      EXPECT_EQ(r.ids, Reference(Prompt(lengths[i], i), p, kv_dtype))
          << "length " << lengths[i] << (seeded ? " seeded" : " greedy") << ", KV " << kv_dtype;
      // The coordinator timed a real Reserve RPC to D (microseconds even on loopback).
      EXPECT_GT(r.timings.reserve_us(), 0) << r.timings.DebugString();
      EXPECT_GE(r.timings.queue_us(), r.timings.reserve_us()) << r.timings.DebugString();
    }
  }
  EXPECT_TRUE(EverythingFree(*stub));
}

}  // namespace duet::cluster_testing
