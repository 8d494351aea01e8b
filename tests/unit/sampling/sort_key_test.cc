// Temperature sampling sorts the candidates as integer keys (sampling.cc): over random rows,
// temperatures and cuts (top_k, top_p, min_p, masked ids, ties, signed zeros) it picks exactly
// the token of the algorithm as sampling.h defines it, which this test writes out literally with
// a comparison sort on (logit, id).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/sampling/sampling.h"
#include "gtest/gtest.h"

namespace duet::compute {
namespace {

// sampling.h's definition, step by step, over every finite candidate sorted.
int32_t Literal(const std::vector<float>& l, const RowSampling& q) {
  const int vocab = static_cast<int>(l.size());
  std::vector<int32_t> idx;
  for (int32_t i = 0; i < vocab; ++i) {
    if (l[i] != -std::numeric_limits<float>::infinity()) idx.push_back(i);
  }
  if (idx.empty()) {
    idx.resize(vocab);
    std::iota(idx.begin(), idx.end(), 0);
  }
  std::sort(idx.begin(), idx.end(),
            [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  if (q.top_k > 0 && q.top_k < static_cast<int>(idx.size())) idx.resize(q.top_k);
  const double inv_t = 1.0 / q.temperature;
  const double max_l = l[idx[0]];
  auto w = [&](int32_t id) { return std::exp((l[id] - max_l) * inv_t); };
  if (q.min_p > 0.f) {
    for (size_t i = 1; i < idx.size(); ++i) {
      if (w(idx[i]) < q.min_p) {
        idx.resize(i);
        break;
      }
    }
  }
  std::vector<double> p(idx.size());
  double sum = 0;
  for (size_t i = 0; i < idx.size(); ++i) sum += (p[i] = w(idx[i]));
  size_t keep = idx.size();
  if (q.top_p < 1.f) {
    double acc = 0;
    for (size_t i = 0; i < idx.size(); ++i) {
      acc += p[i] / sum;
      if (acc >= q.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += p[i];
  const double u = SamplingUniform(q.seed, q.step) * kept;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return idx[i];
  }
  return idx[keep - 1];
}

TEST(SortKeyTest, PicksTheTokenOfTheWholeSort) {
  std::mt19937 rng(7);
  const int vocab = 4096;
  int rows = 0;
  for (float scale : {0.5f, 3.f, 12.f, 40.f}) {
    for (float temperature : {0.02f, 0.3f, 0.7f, 1.f, 3.f}) {
      for (int top_k : {0, 1, 40, 4000}) {
        for (float top_p : {1.f, 0.9f, 0.5f, 0.99999994f}) {
          for (float min_p : {0.f, 1e-30f, 0.05f}) {
            std::normal_distribution<float> normal(0.f, scale);
            std::vector<float> l(vocab);
            for (float& x : l) x = normal(rng);
            // Masked ids, ties at the top, signed zeros (equal logits) and negative logits.
            for (int i = 0; i < vocab; i += 7) l[i] = -std::numeric_limits<float>::infinity();
            l[100] = l[200] = *std::max_element(l.begin(), l.end());
            l[301] = 0.f;
            l[302] = -0.f;
            l[303] = 0.f;
            for (int step = 0; step < 4; ++step) {
              const RowSampling q{.temperature = temperature,
                                  .top_p = top_p,
                                  .top_k = top_k,
                                  .seed = static_cast<uint64_t>(rows),
                                  .step = step,
                                  .min_p = min_p};
              ASSERT_EQ(SampleRowOnHost(l.data(), vocab, q).id, Literal(l, q))
                  << "scale " << scale << " T " << temperature << " top_k " << top_k << " top_p "
                  << top_p << " min_p " << min_p << " step " << step;
              ++rows;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(rows, 4 * 5 * 4 * 4 * 3 * 4);
}

// -0 and +0 are equal logits: ordered by id, as the comparison sort orders them.
TEST(SortKeyTest, SignedZerosAreEqualLogits) {
  const std::vector<float> l = {0.f, -0.f, 0.f, -0.f, -1.f, 1.f};
  for (int step = 0; step < 200; ++step) {
    const RowSampling q{.temperature = 1.f, .seed = 11, .step = step};
    ASSERT_EQ(SampleRowOnHost(l.data(), 6, q).id, Literal(l, q)) << "step " << step;
  }
}

// A row whose every candidate is masked keeps them all, as before.
TEST(SortKeyTest, AllMaskedKeepsEveryCandidate) {
  std::vector<float> l(64, -std::numeric_limits<float>::infinity());
  const RowSampling q{.temperature = 0.8f, .seed = 3, .step = 1};
  EXPECT_EQ(SampleRowOnHost(l.data(), 64, q).id, Literal(l, q));
}

}  // namespace
}  // namespace duet::compute
