// Device sampling (CudaBackend::SampleRows) against the CPU algorithm (SampleRowOnHost) on
// random logits: greedy, temperature, top-k, top-p and their combinations, several seeds and
// steps, vocabularies from 1 to Llama-3's 128256 (odd sizes and sizes below one block), ties.
// Greedy tokens and top-N ids must be equal; sampled tokens must be equal except where the
// CPU's own sums put the draw (or the top-p cut) within kSamplingBoundaryTol of a boundary,
// which the test computes on the CPU to decide (gpu_test_util.h's SamplingMargins);
// log-probabilities within kLogprobTol.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/sampling/sampling.h"
#include "tests/gpu/gpu_test_util.h"

namespace duet::compute {
namespace {

using gpu_testing::DeviceVec;
using gpu_testing::kSamplingBoundaryTol;
using gpu_testing::SamplingMargins;

constexpr float kLogprobTol = 1e-4f;

enum class Shape { kUniform, kPeaked, kTies };

std::vector<float> MakeLogits(int rows, int vocab, Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> l(static_cast<size_t>(rows) * vocab);
  for (float& x : l) {
    x = normal(rng);
    if (shape == Shape::kTies) x = std::round(x);  // ~20 distinct values: ties everywhere
  }
  if (shape == Shape::kPeaked) {
    std::uniform_int_distribution<int> pick(0, vocab - 1);
    for (int r = 0; r < rows; ++r) {
      for (int k = 0; k < 8; ++k) l[static_cast<size_t>(r) * vocab + pick(rng)] = 12.f + k;
    }
  }
  return l;
}

struct SampleCase {
  std::string name;
  int rows;
  int vocab;
  Shape shape;
  RowSampling params;  // seed and step vary per trial
  bool mixed = false;  // row r uses a variant of params (greedy, top-k, top-p, ...)
};

RowSampling ParamsFor(const SampleCase& c, int row, uint64_t seed, int64_t step) {
  RowSampling p = c.params;
  if (c.mixed) {
    switch (row % 5) {
      case 0:
        p = RowSampling{};
        break;  // greedy
      case 1:
        p = RowSampling{.temperature = 0.8f, .num_logprobs = 3};
        break;
      case 2:
        p = RowSampling{.temperature = 1.f, .top_k = 40};
        break;
      case 3:
        p = RowSampling{.temperature = 1.2f, .top_p = 0.9f, .num_logprobs = 20};
        break;
      default:
        p = RowSampling{.num_logprobs = 5};
        break;  // greedy with logprobs
    }
  }
  p.seed = seed + static_cast<uint64_t>(row) * 1000;
  p.step = step + row;
  return p;
}

class CudaSamplingTest : public ::testing::TestWithParam<SampleCase> {};

TEST_P(CudaSamplingTest, MatchesCpu) {
  DUET_CUDA_OR_SKIP(cuda, "f32");
  const SampleCase& c = GetParam();
  const std::vector<float> logits = MakeLogits(c.rows, c.vocab, c.shape, 17 + c.vocab);
  DeviceVec d(cuda.get(), logits);
  int compared = 0, near_boundary = 0;
  // Each row has its own seed and step (ParamsFor); large cases take one trial to keep the CPU
  // reference (two sorts of every row) within a few seconds.
  const std::vector<std::pair<uint64_t, int64_t>> trials = {{1, 0}, {7, 5}, {123456789, 1000}};
  const size_t num_trials = int64_t{c.rows} * c.vocab > 4'000'000 ? 1 : trials.size();
  for (size_t trial = 0; trial < num_trials; ++trial) {
    const auto [seed, step] = trials[trial];
    std::vector<RowSampling> params;
    for (int r = 0; r < c.rows; ++r) params.push_back(ParamsFor(c, r, seed, step));
    auto got = cuda->SampleRows(d.get(), c.rows, c.vocab, params);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), static_cast<size_t>(c.rows));
    for (int r = 0; r < c.rows; ++r) {
      SCOPED_TRACE(::testing::Message() << "row " << r << " seed " << seed << " step " << step);
      const float* row = logits.data() + static_cast<size_t>(r) * c.vocab;
      const SampledToken want = SampleRowOnHost(row, c.vocab, params[r]);
      const SampledToken& g = (*got)[r];
      ASSERT_GE(g.id, 0);
      ASSERT_LT(g.id, c.vocab);
      const gpu_testing::Margins m = SamplingMargins(row, c.vocab, params[r]);
      if (m.Near(kSamplingBoundaryTol)) {
        ++near_boundary;  // either neighbour is right; the logprob must still be g.id's
        EXPECT_NEAR(g.logprob, want.logprob + (row[g.id] - row[want.id]), kLogprobTol);
      } else {
        ++compared;
        EXPECT_EQ(g.id, want.id);
        EXPECT_NEAR(g.logprob, want.logprob, kLogprobTol);
      }
      ASSERT_EQ(g.top_logprobs.size(), want.top_logprobs.size());
      for (size_t i = 0; i < want.top_logprobs.size(); ++i) {
        EXPECT_EQ(g.top_logprobs[i].first, want.top_logprobs[i].first) << "top " << i;
        EXPECT_NEAR(g.top_logprobs[i].second, want.top_logprobs[i].second, kLogprobTol);
      }
    }
  }
  // Boundary cases are rare by construction; most rows must have been compared exactly.
  EXPECT_LE(near_boundary * 100, compared + near_boundary) << near_boundary << " near a boundary";
  ASSERT_TRUE(cuda->status().ok()) << cuda->status();
}

constexpr int kLlama3Vocab = 128256;

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaSamplingTest,
    ::testing::Values(
        SampleCase{"greedy_llama3", 8, kLlama3Vocab, Shape::kUniform, {}},
        SampleCase{
            "greedy_logprobs_llama3", 4, kLlama3Vocab, Shape::kUniform, {.num_logprobs = 20}},
        SampleCase{"greedy_ties", 6, 1000, Shape::kTies, {.num_logprobs = 7}},
        SampleCase{"temperature_llama3", 8, kLlama3Vocab, Shape::kUniform, {.temperature = 1.f}},
        SampleCase{"temperature_peaked_llama3",
                   8,
                   kLlama3Vocab,
                   Shape::kPeaked,
                   {.temperature = 0.7f, .num_logprobs = 5}},
        SampleCase{
            "top_k_llama3", 8, kLlama3Vocab, Shape::kUniform, {.temperature = 0.9f, .top_k = 50}},
        SampleCase{
            "top_p_llama3", 8, kLlama3Vocab, Shape::kPeaked, {.temperature = 1.f, .top_p = 0.9f}},
        SampleCase{"top_p_wide_llama3",
                   4,
                   kLlama3Vocab,
                   Shape::kUniform,
                   {.temperature = 1.5f, .top_p = 0.95f}},
        SampleCase{"top_k_top_p_logprobs",
                   16,
                   32000,
                   Shape::kPeaked,
                   {.temperature = 1.3f, .top_p = 0.8f, .top_k = 40, .num_logprobs = 20}},
        SampleCase{
            "top_k_over_vocab", 5, 100, Shape::kUniform, {.temperature = 1.f, .top_k = 1000}},
        SampleCase{"ties_temperature",
                   12,
                   4097,
                   Shape::kTies,
                   {.temperature = 0.5f, .top_p = 0.7f, .num_logprobs = 4}},
        SampleCase{"odd_vocab", 7, 50257, Shape::kPeaked, {.temperature = 0.8f, .top_k = 7}},
        SampleCase{
            "vocab_below_block", 9, 33, Shape::kUniform, {.temperature = 2.f, .num_logprobs = 20}},
        SampleCase{"vocab_one",
                   3,
                   1,
                   Shape::kUniform,
                   {.temperature = 1.f, .top_p = 0.5f, .num_logprobs = 2}},
        SampleCase{"mixed_rows_llama3", 130, kLlama3Vocab, Shape::kPeaked, {}, /*mixed=*/true},
        SampleCase{"mixed_rows_odd", 41, 257, Shape::kTies, {}, /*mixed=*/true}),
    [](const auto& info) { return info.param.name; });

// Rows with logit processing (bias, bans, penalties) and min_p, mixed with plain rows: the
// device's processed rows equal the CPU's bit for bit (the same float operations), so greedy
// tokens are equal; sampled ones as above; logprobs (of the raw logits) within kLogprobTol.
TEST(CudaSamplingTest, ProcessedRowsAndMinPMatchCpu) {
  DUET_CUDA_OR_SKIP(cuda, "f32");
  for (int vocab : {kLlama3Vocab, 1000, 33}) {
    SCOPED_TRACE(vocab);
    const int rows = 24;
    const std::vector<float> logits = MakeLogits(rows, vocab, Shape::kPeaked, 5 + vocab);
    DeviceVec d(cuda.get(), logits);
    std::mt19937 rng(vocab);
    std::vector<std::vector<PenaltyToken>> penalty(rows);
    std::vector<std::vector<LogitBias>> bias(rows);
    std::vector<std::vector<int32_t>> banned(rows);
    std::vector<RowSampling> params(rows);
    for (int r = 0; r < rows; ++r) {
      for (int id = r % 3; id < vocab; id += 1 + static_cast<int>(rng() % 97)) {
        penalty[r].push_back({id, static_cast<int32_t>(rng() % 4)});
      }
      for (int id = static_cast<int>(rng() % 7); id < vocab;
           id += 1 + static_cast<int>(rng() % 501)) {
        bias[r].push_back({id, static_cast<float>(static_cast<int>(rng() % 201) - 100) / 3.f});
      }
      for (int id = 1; id < vocab && banned[r].size() < 3; id += 11) banned[r].push_back(id);
      RowSampling& p = params[r];
      p = RowSampling{.seed = 40u + r, .step = r, .num_logprobs = r % 3 == 0 ? 5 : 0};
      if (r % 2) p.temperature = 0.6f + 0.1f * (r % 5);
      if (r % 4 == 1) p.min_p = 0.05f * (r % 3);
      if (r % 4 == 3) p.top_k = 30;
      switch (r % 6) {
        case 0:
          break;  // plain
        case 1:
          p.repetition_penalty = 1.3f;
          p.penalty_tokens = penalty[r];
          break;
        case 2:
          p.presence_penalty = 0.7f;
          p.frequency_penalty = -0.4f;
          p.penalty_tokens = penalty[r];
          break;
        case 3:
          p.logit_bias = bias[r];
          break;
        case 4:
          p.banned_ids = banned[r];
          p.repetition_penalty = 0.9f;
          p.penalty_tokens = penalty[r];
          break;
        default:
          p.logit_bias = bias[r];
          p.banned_ids = banned[r];
          p.frequency_penalty = 1.f;
          p.penalty_tokens = penalty[r];
          break;
      }
    }
    auto got = cuda->SampleRows(d.get(), rows, vocab, params);
    ASSERT_TRUE(got.ok()) << got.status();
    for (int r = 0; r < rows; ++r) {
      SCOPED_TRACE(r);
      const float* row = logits.data() + static_cast<size_t>(r) * vocab;
      std::vector<float> processed(row, row + vocab);
      ProcessLogitsOnHost(processed.data(), vocab, params[r]);
      const SampledToken want = SampleRowOnHost(row, vocab, params[r]);
      const SampledToken& g = (*got)[r];
      if (!SamplingMargins(processed.data(), vocab, params[r]).Near(kSamplingBoundaryTol)) {
        EXPECT_EQ(g.id, want.id);
        EXPECT_NEAR(g.logprob, want.logprob, kLogprobTol);
      }
      ASSERT_EQ(g.top_logprobs.size(), want.top_logprobs.size());
      for (size_t i = 0; i < want.top_logprobs.size(); ++i) {
        EXPECT_EQ(g.top_logprobs[i].first, want.top_logprobs[i].first) << "top " << i;
      }
    }
  }
  ASSERT_TRUE(cuda->status().ok()) << cuda->status();
}

TEST(CudaSamplingTest, NoRowsAndBadParameters) {
  DUET_CUDA_OR_SKIP(cuda, "f32");
  DeviceVec d(cuda.get(), std::vector<float>(64, 0.f));
  auto none = cuda->SampleRows(d.get(), 0, 64, {});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  const RowSampling bad{.temperature = 1.f, .top_p = 0.f};
  EXPECT_EQ(cuda->SampleRows(d.get(), 1, 64, {bad}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const RowSampling many{.num_logprobs = kMaxTopLogprobs + 1};
  EXPECT_EQ(cuda->SampleRows(d.get(), 1, 64, {many}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(cuda->status().ok()) << cuda->status();
}

// The scratch buffers grow and are reused: a large call, a small one, a large one again give
// the CPU's greedy tokens each time.
TEST(CudaSamplingTest, ReusesScratchAcrossShapes) {
  DUET_CUDA_OR_SKIP(cuda, "f32");
  for (int rows : {2, 64, 1, 64}) {
    const int vocab = rows == 64 ? kLlama3Vocab : 999;
    const std::vector<float> logits = MakeLogits(rows, vocab, Shape::kPeaked, rows);
    DeviceVec d(cuda.get(), logits);
    std::vector<RowSampling> params(
        rows, RowSampling{.temperature = 0.6f, .top_k = 20, .seed = 3, .num_logprobs = 2});
    auto got = cuda->SampleRows(d.get(), rows, vocab, params);
    ASSERT_TRUE(got.ok()) << got.status();
    for (int r = 0; r < rows; ++r) {
      const float* row = logits.data() + static_cast<size_t>(r) * vocab;
      const gpu_testing::Margins m = SamplingMargins(row, vocab, params[r]);
      if (m.Near(kSamplingBoundaryTol)) continue;
      EXPECT_EQ((*got)[r].id, SampleRowOnHost(row, vocab, params[r]).id)
          << rows << " rows, row " << r;
    }
  }
}

}  // namespace
}  // namespace duet::compute
