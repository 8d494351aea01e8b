// ComputeBackend::SampleRows on the CPU backend: each row sampled as SampleRowOnHost samples it
// alone (its own logits, its own parameters), the (seed, step) draw pinned to its historic
// values (prefill and decode nodes of different builds must agree), top-p cuts, and argument
// checks. The algorithm's own tests are tests/unit/sampling/sampler_test.cc.
#include "common/sampling/sampling.h"

#include <cmath>
#include <set>
#include <vector>

#include "common/compute/compute_backend.h"
#include "gtest/gtest.h"

namespace duet::compute {
namespace {

std::vector<float> RowLogits(int rows, int vocab) {
  std::vector<float> l(static_cast<size_t>(rows) * vocab);
  for (size_t i = 0; i < l.size(); ++i) {
    l[i] = std::sin(0.37f * static_cast<float>(i)) * 4.f + static_cast<float>(i % 7);
  }
  return l;
}

void ExpectSameToken(const SampledToken& got, const SampledToken& want) {
  EXPECT_EQ(got.id, want.id);
  EXPECT_EQ(got.logprob, want.logprob);
  EXPECT_EQ(got.top_logprobs, want.top_logprobs);
}

// Each row sampled as SampleRowOnHost samples it alone.
void ExpectRowsSampledAlone(ComputeBackend& backend) {
  const int rows = 5, vocab = 301;
  const std::vector<float> logits = RowLogits(rows, vocab);
  const std::vector<RowSampling> params = {
      {},
      {.temperature = 0.9f, .seed = 3, .step = 4, .num_logprobs = 3},
      {.temperature = 1.5f, .top_k = 10, .seed = 8, .step = 0},
      {.temperature = 1.1f, .top_p = 0.6f, .seed = 8, .step = 9, .num_logprobs = 20},
      {.num_logprobs = 2},
  };
  auto got = backend.SampleRows(logits.data(), rows, vocab, params);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), static_cast<size_t>(rows));
  std::set<int32_t> ids;
  for (int r = 0; r < rows; ++r) {
    SCOPED_TRACE(r);
    ExpectSameToken((*got)[r], SampleRowOnHost(logits.data() + r * vocab, vocab, params[r]));
    EXPECT_EQ((*got)[r].top_logprobs.size(), static_cast<size_t>(params[r].num_logprobs));
    ids.insert((*got)[r].id);
  }
  EXPECT_GT(ids.size(), 1u);  // the rows differ, so would a mixed-up row
}

TEST(SampleRowsTest, CpuBackendSamplesEachRowWithItsOwnParameters) {
  for (int threads : {1, 3}) {  // rows are spread over the pool: any thread count, same tokens
    SCOPED_TRACE(threads);
    auto backend = CreateBackend(compute::Device::kCpu, {.num_threads = threads});
    ASSERT_TRUE(backend.ok()) << backend.status();
    ExpectRowsSampledAlone(**backend);
  }
}

// The draw of a (seed, step) must never change: a prefill node and a decode node sample parts
// of one request. Values of the formula as first shipped (model/sampler.cc).
TEST(SampleRowsTest, DrawIsPinned) {
  EXPECT_EQ(SamplingUniform(0, 0), 5876733520225071.0 / 9007199254740992.0);
  EXPECT_EQ(SamplingUniform(42, 7), 774905205516092.0 / 9007199254740992.0);
  EXPECT_EQ(SamplingUniform(123456789, 1000), 1205502105413605.0 / 9007199254740992.0);
}

TEST(SampleRowsTest, TopPKeepsTheShortestPrefixReachingIt) {
  // Probabilities 0.5, 0.3, 0.2 (temperature 1): top_p 0.7 keeps ids 0 and 1 only.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::set<int32_t> seen;
  for (int step = 0; step < 300; ++step) {
    const RowSampling p{.temperature = 1.f, .top_p = 0.7f, .seed = 5, .step = step};
    seen.insert(SampleRowOnHost(logits.data(), 3, p).id);
  }
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));
}

TEST(SampleRowsTest, NoRowsAndBadArguments) {
  auto backend = CreateBackend(compute::Device::kCpu, {.num_threads = 1});
  ASSERT_TRUE(backend.ok()) << backend.status();
  const std::vector<float> logits(8, 0.f);
  auto none = (*backend)->SampleRows(logits.data(), 0, 8, {});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  auto bad = [&](int rows, int vocab, std::vector<RowSampling> params) {
    return (*backend)->SampleRows(logits.data(), rows, vocab, params).status().code();
  };
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(bad(1, 0, {{}}), kInvalid);
  EXPECT_EQ(bad(2, 4, {{}}), kInvalid);  // one parameter set for two rows
  EXPECT_EQ(bad(1, 8, {{.top_p = 0.f}}), kInvalid);
  EXPECT_EQ(bad(1, 8, {{.temperature = -1.f}}), kInvalid);
  EXPECT_EQ(bad(1, 8, {{.top_k = -1}}), kInvalid);
  EXPECT_EQ(bad(1, 8, {{.num_logprobs = kMaxTopLogprobs + 1}}), kInvalid);
  EXPECT_NE(ValidateRowSampling(1, 8, {{.top_p = 2.f}}).message().find("row 0"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace duet::compute
