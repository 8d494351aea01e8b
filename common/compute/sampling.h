// Token sampling as the backends run it: one row of logits in, one token (plus its log-probability
// and the top-N alternatives) out. The algorithm is defined once here (SampleRowOnHost, the CPU
// backend's implementation and the reference the CUDA kernels are tested against):
//   - temperature <= 0: greedy, the argmax (lowest id on ties);
//   - else candidates sorted by logit (desc, id asc on ties), cut to the top_k best (0: all),
//     then to the shortest prefix whose normalised probability (at the temperature) reaches
//     top_p; a uniform draw u in [0, 1) from (seed, step) picks the first candidate whose
//     cumulative weight exceeds u * (kept weight).
//   - logprob: log-softmax of the raw logits (temperature 1); top_logprobs: the num_logprobs best
//     by logit, best first.
// The draw depends only on (seed, step), so a request sampled partly on a prefill node and partly
// on a decode node draws exactly what one process would.
//
//   RowSampling p{.temperature = 0.7f, .top_p = 0.9f, .seed = 1, .step = 0, .num_logprobs = 5};
//   SampledToken t = SampleRowOnHost(logits, vocab, p);
//   DUET_ASSIGN_OR_RETURN(std::vector<SampledToken> ts,
//                         backend->SampleRows(device_logits, rows, vocab, params));
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/compute/uniform_hash.h"  // SamplingUniform

namespace duet::compute {

// Most top log-probabilities a row may ask for (the OpenAI API's limit).
inline constexpr int kMaxTopLogprobs = 20;

// How to sample one row.
struct RowSampling {
  float temperature = 0.f;  // <= 0: greedy
  float top_p = 1.f;        // (0, 1]
  int top_k = 0;            // 0: off
  uint64_t seed = 0;
  int64_t step = 0;      // index of the output token being sampled (0: the first)
  int num_logprobs = 0;  // top-N log-probabilities to report, [0, kMaxTopLogprobs]
};

struct SampledToken {
  int32_t id = -1;
  float logprob = 0.f;  // log-softmax of the raw logits (temperature 1), as OpenAI reports
  std::vector<std::pair<int32_t, float>> top_logprobs;  // best first
};

// InvalidArgument unless rows >= 0, vocab > 0 and every row's parameters are in range
// (params.size() == rows). Backends call it before sampling.
absl::Status ValidateRowSampling(int rows, int vocab, absl::Span<const RowSampling> params);

// Samples one row of host logits (the CPU backend's SampleRows, row by row).
SampledToken SampleRowOnHost(const float* logits, int vocab, const RowSampling& params);

}  // namespace duet::compute
