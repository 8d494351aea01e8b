#include "common/sampling/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "boost/sort/spreadsort/integer_sort.hpp"
#include "common/base/status.h"

namespace duet::compute {
namespace {

int32_t Argmax(const float* logits, int vocab) {
  int32_t best = 0;
  for (int i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;  // lowest id wins ties
  }
  return best;
}

// Sorts `ids` by logit descending, id ascending on ties (-0 and +0 equal), as one integer key
// each (the logit's bits made order-preserving and flipped, then the id), with Boost's
// spreadsort: the same order as a comparison sort on (logit, id), several times faster on a
// vocabulary (no indirection per comparison). Logits are not NaN.
void SortByLogitDescending(const float* logits, std::vector<int32_t>& ids) {
  std::vector<uint64_t> keys(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const float l = logits[ids[i]] == 0.f ? 0.f : logits[ids[i]];
    uint32_t bits;
    std::memcpy(&bits, &l, sizeof(bits));
    // Ascending order of floats as unsigned integers, then flipped: descending logits.
    const uint32_t ascending = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    keys[i] = (static_cast<uint64_t>(~ascending) << 32) | static_cast<uint32_t>(ids[i]);
  }
  boost::sort::spreadsort::integer_sort(keys.begin(), keys.end());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(keys[i] & 0xffffffffu);
}

// Temperature sampling over the candidates sorted by logit (desc, id asc on ties).
int32_t SampleWithTemperature(const float* logits, int vocab, const RowSampling& params) {
  // Candidates at -inf (masked by a grammar, banned) have weight exactly 0 wherever they would
  // sort: they change no cut, no sum and no draw, so leaving them out of the sort gives the same
  // token (a masked row then sorts only what its grammar allows). A row with nothing finite
  // keeps them all.
  std::vector<int32_t> idx;
  idx.reserve(vocab);
  for (int32_t i = 0; i < vocab; ++i) {
    if (logits[i] != -std::numeric_limits<float>::infinity()) idx.push_back(i);
  }
  if (idx.empty()) {
    idx.resize(vocab);
    std::iota(idx.begin(), idx.end(), 0);
  }
  const int n = static_cast<int>(idx.size());
  const int k = params.top_k > 0 ? std::min(params.top_k, n) : n;
  if (k < n) {
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    idx.resize(k);
  } else {
    SortByLogitDescending(logits, idx);
  }
  const double inv_t = 1.0 / params.temperature;
  const double max_l = logits[idx[0]];
  auto weight = [&](int32_t id) { return std::exp((logits[id] - max_l) * inv_t); };
  if (params.min_p > 0.f) {
    // The first candidate's weight is 1 >= min_p: at least one stays.
    for (size_t i = 1; i < idx.size(); ++i) {
      if (weight(idx[i]) < params.min_p) {
        idx.resize(i);
        break;
      }
    }
  }
  std::vector<double> p(idx.size());
  double sum = 0;
  for (size_t i = 0; i < idx.size(); ++i) {
    p[i] = weight(idx[i]);
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

template <typename T, typename Id>
bool StrictlyIncreasing(absl::Span<const T> v, Id id) {
  for (size_t i = 1; i < v.size(); ++i) {
    if (!(id(v[i - 1]) < id(v[i]))) return false;
  }
  return true;
}

absl::Status ValidateProcessing(size_t r, int vocab, const RowSampling& p) {
  auto bad = [&](auto... what) {
    return absl::InvalidArgumentError(absl::StrCat("SampleRows: row ", r, " ", what...));
  };
  if (!(p.min_p >= 0.f && p.min_p <= 1.f)) return bad("has min_p ", p.min_p, " outside [0, 1]");
  if (!(p.repetition_penalty > 0.f) || !std::isfinite(p.repetition_penalty)) {
    return bad("has repetition_penalty ", p.repetition_penalty, " (must be > 0)");
  }
  if (!std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty)) {
    return bad("has a penalty that is not finite");
  }
  for (const PenaltyToken& t : p.penalty_tokens) {
    if (t.id < 0 || t.id >= vocab || t.output_count < 0) {
      return bad("has penalty token ", t.id, " (count ", t.output_count,
                 ") outside the vocabulary");
    }
  }
  for (const LogitBias& b : p.logit_bias) {
    if (b.id < 0 || b.id >= vocab || !std::isfinite(b.bias)) {
      return bad("has logit bias ", b.bias, " for token ", b.id);
    }
  }
  if (!StrictlyIncreasing(p.logit_bias, [](const LogitBias& b) { return b.id; })) {
    return bad("has logit bias ids that are not strictly increasing");
  }
  for (int32_t id : p.banned_ids) {
    if (id < 0 || id >= vocab) return bad("bans token ", id, " outside the vocabulary");
  }
  if (!StrictlyIncreasing(p.banned_ids, [](int32_t id) { return id; }) ||
      p.banned_ids.size() >= static_cast<size_t>(vocab)) {
    return bad("bans ids that are not strictly increasing or leave no token");
  }
  return absl::OkStatus();
}

}  // namespace

bool HasLogitProcessing(const RowSampling& p) {
  const bool penalties =
      p.repetition_penalty != 1.f || p.presence_penalty != 0.f || p.frequency_penalty != 0.f;
  return !p.logit_bias.empty() || !p.banned_ids.empty() || (penalties && !p.penalty_tokens.empty());
}

void ProcessLogitsOnHost(float* logits, int vocab, const RowSampling& p) {
  (void)vocab;  // every id was checked against it (ValidateRowSampling)
  for (const LogitBias& b : p.logit_bias) logits[b.id] += b.bias;
  for (int32_t id : p.banned_ids) logits[id] = -std::numeric_limits<float>::infinity();
  const float rep = p.repetition_penalty;
  for (const PenaltyToken& t : p.penalty_tokens) {
    float l = logits[t.id];
    if (rep != 1.f) l = l > 0.f ? l / rep : l * rep;
    if (t.output_count > 0) {
      l = std::fma(-p.frequency_penalty, static_cast<float>(t.output_count), l) -
          p.presence_penalty;
    }
    logits[t.id] = l;
  }
}

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
    DUET_RETURN_IF_ERROR(ValidateProcessing(r, vocab, p));
  }
  return absl::OkStatus();
}

SampledToken SampleRowOnHost(const float* logits, int vocab, const RowSampling& params) {
  const float* row = logits;
  std::vector<float> processed;
  if (HasLogitProcessing(params)) {
    processed.assign(logits, logits + vocab);
    ProcessLogitsOnHost(processed.data(), vocab, params);
    row = processed.data();
  }
  const int32_t id =
      params.temperature <= 0.f ? Argmax(row, vocab) : SampleWithTemperature(row, vocab, params);
  // Log-probabilities of the raw distribution.
  return ScoreRowOnHost(logits, vocab, id, params.num_logprobs);
}

SampledToken ScoreRowOnHost(const float* logits, int vocab, int32_t token, int num_logprobs) {
  SampledToken out;
  out.id = token;
  double max_l = logits[0];
  for (int i = 1; i < vocab; ++i) max_l = std::max<double>(max_l, logits[i]);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(logits[i] - max_l);
  const double log_z = max_l + std::log(sum);
  out.logprob = static_cast<float>(logits[token] - log_z);
  if (num_logprobs > 0) {
    const int n = std::min(num_logprobs, vocab);
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

void MaskRowOnHost(float* logits, int vocab, absl::Span<const int32_t> allowed_words) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  for (int t = 0; t < vocab; ++t) {
    if (((static_cast<uint32_t>(allowed_words[t >> 5]) >> (t & 31)) & 1u) == 0) {
      logits[t] = minus_inf;
    }
  }
}

absl::Status ValidateRowMasks(int rows, int vocab, absl::Span<const RowMask> masks) {
  const size_t words = (static_cast<size_t>(vocab) + 31) / 32;
  std::vector<bool> seen(rows > 0 ? rows : 0);
  for (const RowMask& m : masks) {
    if (m.row < 0 || m.row >= rows || seen[m.row]) {
      return absl::InvalidArgumentError(
          absl::StrCat("token mask for row ", m.row, " of ", rows, " (each row at most once)"));
    }
    seen[m.row] = true;
    if (m.allowed_words.size() != words) {
      return absl::InvalidArgumentError(absl::StrCat("token mask of row ", m.row, " has ",
                                                     m.allowed_words.size(), " words; a vocab of ",
                                                     vocab, " needs ", words));
    }
  }
  return absl::OkStatus();
}

}  // namespace duet::compute
