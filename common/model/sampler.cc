#include "common/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace duet::model {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from (seed, step).
double Uniform(uint64_t seed, int64_t step) {
  const uint64_t r = SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(step));
  return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);
}

int32_t Argmax(const float* logits, int vocab) {
  int32_t best = 0;
  for (int i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;  // lowest id wins ties
  }
  return best;
}

}  // namespace

absl::Status SamplingParams::Validate(int vocab_size) const {
  if (!(temperature >= 0.f) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be >= 0, got ", temperature));
  }
  if (!(top_p > 0.f && top_p <= 1.f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", top_k));
  if (max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", max_tokens));
  }
  if (logprobs < 0 || logprobs > 20) {
    return absl::InvalidArgumentError(absl::StrCat("logprobs must be in [0, 20], got ", logprobs));
  }
  for (int32_t id : stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop token id ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

const char* StopReasonName(StopReason r) {
  switch (r) {
    case StopReason::kNone: return "none";
    case StopReason::kEos: return "eos";
    case StopReason::kStopToken: return "stop";
    case StopReason::kMaxTokens: return "length";
  }
  return "unknown";
}

SampledToken Sample(const float* logits, int vocab, const SamplingParams& params, int64_t step) {
  SampledToken out;
  if (params.temperature <= 0.f) {
    out.id = Argmax(logits, vocab);
  } else {
    // Candidates sorted by logit (desc, id asc on ties), cut by top-k, then top-p.
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
    const double u = Uniform(params.seed, step) * kept_sum;
    double acc = 0;
    out.id = idx[keep - 1];
    for (size_t i = 0; i < keep; ++i) {
      acc += p[i];
      if (u < acc) {
        out.id = idx[i];
        break;
      }
    }
  }
  // Log-probabilities of the raw distribution.
  double max_l = logits[0];
  for (int i = 1; i < vocab; ++i) max_l = std::max<double>(max_l, logits[i]);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(logits[i] - max_l);
  const double log_z = max_l + std::log(sum);
  out.logprob = static_cast<float>(logits[out.id] - log_z);
  if (params.logprobs > 0) {
    const int n = std::min(params.logprobs, vocab);
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

StopReason CheckStop(const SamplingParams& params, const std::vector<int32_t>& eos_ids,
                     int32_t token, int generated) {
  if (!params.ignore_eos &&
      std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end()) {
    return StopReason::kEos;
  }
  if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) !=
      params.stop_token_ids.end()) {
    return StopReason::kStopToken;
  }
  if (generated >= params.max_tokens) return StopReason::kMaxTokens;
  return StopReason::kNone;
}

}  // namespace duet::model
