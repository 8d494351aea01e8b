#include "common/compute/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace duet::compute {
namespace {

int32_t Argmax(const float* logits, int vocab) {
  int32_t best = 0;
  for (int i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;  // lowest id wins ties
  }
  return best;
}

// Temperature sampling over the candidates sorted by logit (desc, id asc on ties).
int32_t SampleWithTemperature(const float* logits, int vocab, const RowSampling& params) {
  std::vector<int32_t> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  const int k = params.top_k > 0 ? std::min(params.top_k, vocab) : vocab;
  auto cmp = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (k < vocab) {
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), cmp);
    idx.resize(k);
  } else {
    std::sort(idx.begin(), idx.end(), cmp);
  }
  const double inv_t = 1.0 / params.temperature;
  const double max_l = logits[idx[0]];
  std::vector<double> p(idx.size());
  double sum = 0;
  for (size_t i = 0; i < idx.size(); ++i) {
    p[i] = std::exp((logits[idx[i]] - max_l) * inv_t);
    sum += p[i];
  }
  size_t keep = idx.size();
  if (params.top_p < 1.f) {
    double acc = 0;
    for (size_t i = 0; i < idx.size(); ++i) {
      acc += p[i] / sum;
      if (acc >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept_sum = 0;
  for (size_t i = 0; i < keep; ++i) kept_sum += p[i];
  const double u = SamplingUniform(params.seed, params.step) * kept_sum;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace

absl::Status ValidateRowSampling(int rows, int vocab, absl::Span<const RowSampling> params) {
  if (rows < 0 || vocab <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleRows: bad logits shape ", rows, "x", vocab));
  }
  if (params.size() != static_cast<size_t>(rows)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleRows: ", params.size(), " parameter sets for ", rows, " rows"));
  }
  for (size_t r = 0; r < params.size(); ++r) {
    const RowSampling& p = params[r];
    if (!(p.temperature >= 0.f) || !std::isfinite(p.temperature) ||
        !(p.top_p > 0.f && p.top_p <= 1.f) || p.top_k < 0 || p.num_logprobs < 0 ||
        p.num_logprobs > kMaxTopLogprobs) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SampleRows: row ", r, " has bad parameters (temperature ", p.temperature, ", top_p ",
          p.top_p, ", top_k ", p.top_k, ", logprobs ", p.num_logprobs, ")"));
    }
  }
  return absl::OkStatus();
}

SampledToken SampleRowOnHost(const float* logits, int vocab, const RowSampling& params) {
  SampledToken out;
  out.id = params.temperature <= 0.f ? Argmax(logits, vocab)
                                     : SampleWithTemperature(logits, vocab, params);
  // Log-probabilities of the raw distribution.
  double max_l = logits[0];
  for (int i = 1; i < vocab; ++i) max_l = std::max<double>(max_l, logits[i]);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(logits[i] - max_l);
  const double log_z = max_l + std::log(sum);
  out.logprob = static_cast<float>(logits[out.id] - log_z);
  if (params.num_logprobs > 0) {
    const int n = std::min(params.num_logprobs, vocab);
    std::vector<int32_t> idx(vocab);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int i = 0; i < n; ++i) {
      out.top_logprobs.emplace_back(idx[i], static_cast<float>(logits[idx[i]] - log_z));
    }
  }
  return out;
}

}  // namespace duet::compute
