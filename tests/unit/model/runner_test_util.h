// Shared pieces of the ModelRunner tests: the synthetic model on a cpu backend, one-sequence
// runs, and the cache-exactness and batch-invariance checks every weight and KV form must pass.
//
//   Model m = MakeModel({}, /*block_size=*/8, 256, /*threads=*/2, kv::KvDtype::kInt8);
//   ExpectDecodeAndChunksEqualRecompute(m, "int8");
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cpu/cpu_isa.h"
#include "common/kv/block_pool.h"
#include "common/kv/block_table.h"
#include "common/model/model_runner.h"
#include "common/model/synthetic_model.h"
#include "common/weights/weights.h"

namespace duet::model::testing {

namespace fs = std::filesystem;

struct Model {
  std::unique_ptr<compute::ComputeBackend> backend;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<kv::BlockPool> pool;
};

// Changes the loaded weights before the runner takes them (e.g. keeps matrices quantized).
using WeightsEdit = std::function<void(const ModelConfig&, ModelWeights&)>;

// The synthetic "tiny" model (with overrides `o`) on a cpu backend.
inline Model MakeModel(const SyntheticOverrides& o, int block_size = 16, int64_t num_blocks = 256,
                       int threads = 2, kv::KvDtype kv_dtype = kv::KvDtype::kF32,
                       const WeightsEdit& edit = nullptr,
                       std::optional<compute::cpu::CpuIsa> cpu_isa = std::nullopt,
                       WeightsDtype weights_dtype = WeightsDtype::kF32,
                       compute::CpuGemm cpu_gemm = compute::CpuGemm::kInvariant) {
  static int counter = 0;
  const fs::path dir = fs::temp_directory_path() / ("duet_runner_test_" + std::to_string(getpid()) +
                                                    "_" + std::to_string(counter++));
  EXPECT_TRUE(WriteSyntheticModel("tiny", 11, dir.string(), o).ok());
  auto config = ModelConfig::FromJsonFile((dir / "config.json").string());
  EXPECT_TRUE(config.ok()) << config.status();
  auto weights = LoadWeights(dir.string(), *config, weights_dtype);
  EXPECT_TRUE(weights.ok()) << weights.status();
  fs::remove_all(dir);
  if (edit) edit(*config, *weights);
  Model m;
  m.backend = *compute::CreateBackend(
      compute::Device::kCpu, {.num_threads = threads, .cpu_gemm = cpu_gemm, .cpu_isa = cpu_isa});
  auto runner = ModelRunner::Create(*config, std::move(*weights), m.backend.get());
  EXPECT_TRUE(runner.ok()) << runner.status();
  m.runner = std::move(*runner);
  EXPECT_TRUE(m.runner->SetKvDtype(kv_dtype).ok());
  m.pool = *kv::BlockPool::Create(m.runner->MakeKvLayout(block_size), num_blocks);
  return m;
}

inline std::vector<int32_t> Tokens(int n, int salt, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + salt * 101 + 5) % vocab;
  return t;
}

// Room in each sequence's table for its new tokens, as a scheduler makes it before Forward (which
// never allocates). ResourceExhausted when the pool is out.
inline absl::Status ReserveFor(absl::Span<const SequenceInput> batch) {
  for (const SequenceInput& s : batch) {
    absl::Status st = s.table->Reserve(s.start_pos + static_cast<int64_t>(s.tokens.size()));
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

inline std::vector<float> RunOne(Model& m, kv::BlockTable& table,
                                 const std::vector<int32_t>& tokens) {
  std::vector<SequenceInput> b = {{.seq_id = 1,
                                   .tokens = tokens,
                                   .start_pos = static_cast<int32_t>(table.num_tokens()),
                                   .table = &table,
                                   .want_logits = true}};
  EXPECT_TRUE(ReserveFor(b).ok());
  auto out = m.runner->Forward(absl::MakeSpan(b), m.pool->View());
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? out->logits : std::vector<float>();
}

inline double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * double(a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Decode with the cache, and a prefill in chunks, give bitwise the logits of a full recompute,
// across block boundaries (blocks of 8); the pool is whole again afterwards.
inline void ExpectDecodeAndChunksEqualRecompute(Model& m, const std::string& what) {
  const int vocab = m.runner->config().vocab_size;
  for (int prefix : {1, 8, 13}) {
    const std::vector<int32_t> all = Tokens(prefix + 3, prefix, vocab);
    kv::BlockTable cached(m.pool.get());
    RunOne(m, cached, std::vector<int32_t>(all.begin(), all.begin() + prefix));
    for (int step = 0; step < 3; ++step) {
      const int pos = prefix + step;
      std::vector<float> dec = RunOne(m, cached, {all[pos]});
      kv::BlockTable fresh(m.pool.get());
      std::vector<float> full =
          RunOne(m, fresh, std::vector<int32_t>(all.begin(), all.begin() + pos + 1));
      EXPECT_EQ(dec, full) << what << " prefix " << prefix << " step " << step;
    }
  }
  const auto t = Tokens(40, 3, vocab);
  kv::BlockTable a(m.pool.get()), b(m.pool.get());
  std::vector<float> one = RunOne(m, a, t);
  RunOne(m, b, std::vector<int32_t>(t.begin(), t.begin() + 17));
  EXPECT_EQ(RunOne(m, b, std::vector<int32_t>(t.begin() + 17, t.end())), one);
  ASSERT_TRUE(a.Release().ok());
  ASSERT_TRUE(b.Release().ok());
  EXPECT_EQ(m.pool->num_available(), m.pool->num_blocks());
}

// Every CPU path this machine runs gives the scalar path's logits bit for bit. make(isa): the
// model under test on that path. Returns false (nothing compared) when only scalar runs here.
inline bool ExpectEveryCpuPathGivesTheScalarLogits(
    const std::function<Model(compute::cpu::CpuIsa isa)>& make) {
  using compute::cpu::CpuIsa;
  Model scalar = make(CpuIsa::kScalar);
  const auto t = Tokens(19, 6, scalar.runner->config().vocab_size);
  kv::BlockTable ts(scalar.pool.get());
  const std::vector<float> want = RunOne(scalar, ts, t);
  int paths = 0;
  for (CpuIsa isa : compute::cpu::kAllCpuIsas) {
    if (isa == CpuIsa::kScalar || !compute::cpu::ResolveCpuIsa(isa).ok()) continue;
    ++paths;
    Model m = make(isa);
    kv::BlockTable tt(m.pool.get());
    EXPECT_EQ(RunOne(m, tt, t), want) << compute::cpu::CpuIsaName(isa);
  }
  return paths > 0;
}

// A sequence's logits are bitwise identical alone (one thread) and inside a batch that mixes
// prefill and decode sequences, whatever its position, for 1, 2 and 3 threads. make(threads):
// the model under test.
inline void ExpectBatchInvariant(const std::function<Model(int threads)>& make,
                                 const std::string& what) {
  for (int threads : {1, 2, 3}) {
    Model m = make(threads);
    Model alone_model = make(1);
    const int vocab = m.runner->config().vocab_size;
    const auto a_prompt = Tokens(21, 1, vocab);
    // Alone: prefill then two decode steps.
    kv::BlockTable alone(alone_model.pool.get());
    std::vector<std::vector<float>> ref;
    ref.push_back(RunOne(alone_model, alone, a_prompt));
    ref.push_back(RunOne(alone_model, alone, {5}));
    ref.push_back(RunOne(alone_model, alone, {9}));

    // Batched: A's prefill beside B's prefill; then A's decodes beside B's decodes and C's
    // prefill.
    kv::BlockTable ta(m.pool.get()), tb(m.pool.get()), tc(m.pool.get());
    std::vector<SequenceInput> b1 = {
        {.seq_id = 2, .tokens = Tokens(33, 2, vocab), .start_pos = 0, .table = &tb},
        {.seq_id = 1, .tokens = a_prompt, .start_pos = 0, .table = &ta}};
    ASSERT_TRUE(ReserveFor(b1).ok());
    auto o1 = m.runner->Forward(absl::MakeSpan(b1), m.pool->View());
    ASSERT_TRUE(o1.ok()) << o1.status();
    ASSERT_EQ(o1->seq_ids[1], 1);
    EXPECT_EQ(0, std::memcmp(o1->Row(1), ref[0].data(), vocab * sizeof(float)))
        << what << ": prefill differs in a batch, threads=" << threads;
    int step = 1;
    for (int32_t tok : {5, 9}) {
      std::vector<SequenceInput> b2 = {
          {.seq_id = 3, .tokens = Tokens(3 + step, 3, vocab), .start_pos = 0, .table = &tc},
          {.seq_id = 2,
           .tokens = {7},
           .start_pos = static_cast<int32_t>(tb.num_tokens()),
           .table = &tb},
          {.seq_id = 1,
           .tokens = {tok},
           .start_pos = static_cast<int32_t>(ta.num_tokens()),
           .table = &ta}};
      ASSERT_TRUE(ReserveFor(b2).ok());
      auto o2 = m.runner->Forward(absl::MakeSpan(b2), m.pool->View());
      ASSERT_TRUE(o2.ok()) << o2.status();
      EXPECT_EQ(0, std::memcmp(o2->Row(2), ref[step].data(), vocab * sizeof(float)))
          << what << ": decode step " << step << " differs in a batch, threads=" << threads;
      ASSERT_TRUE(tc.Release().ok());
      ++step;
    }
  }
}

}  // namespace duet::model::testing
