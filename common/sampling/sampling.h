// Token sampling as the backends run it: one row of logits in, one token (plus its log-probability
// and the top-N alternatives) out. The algorithm is defined once here (SampleRowOnHost, the CPU
// backend's implementation and the reference the CUDA kernels are tested against):
//   - logit processing (vLLM's order), on a copy of the row, in float: logit_bias added; the
//     banned ids (min_tokens' stop tokens) set to -inf; then for each penalty token (prompt or
//     output, output_count times generated): l = l > 0 ? l / repetition_penalty
//     : l * repetition_penalty, and when output_count > 0
//     l = fma(-frequency_penalty, output_count, l) - presence_penalty;
//   - temperature <= 0: greedy, the argmax of the processed row (lowest id on ties);
//   - else candidates sorted by processed logit (desc, id asc on ties), cut to the top_k best
//     (0: all), then to the prefix whose weight w = exp((l - l_max) / T) (the probability relative
//     to the best's) is >= min_p, then to the shortest prefix whose normalised probability
//     reaches top_p; a uniform draw u in [0, 1) from (seed, step) picks the first candidate
//     whose cumulative weight exceeds u * (kept weight).
//   - logprob: log-softmax of the raw logits (temperature 1, no processing: vLLM's default);
//     top_logprobs: the num_logprobs best raw logits, best first.
// The draw depends only on (seed, step), so a request sampled partly on a prefill node and partly
// on a decode node draws exactly what one process would.
//
//   RowSampling p{.temperature = 0.7f, .top_p = 0.9f, .seed = 1, .step = 0, .num_logprobs = 5,
//                 .min_p = 0.05f, .repetition_penalty = 1.1f, .penalty_tokens = history};
//   SampledToken t = SampleRowOnHost(logits, vocab, p);
//   DUET_ASSIGN_OR_RETURN(std::vector<SampledToken> ts,
//                         backend->SampleRows(device_logits, rows, vocab, params));
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/base/uniform_hash.h"  // SamplingUniform

namespace duet::compute {

// Most top log-probabilities a row may ask for (the OpenAI API's limit).
inline constexpr int kMaxTopLogprobs = 20;

// A token of the prompt or the output, for the penalties: output_count is how often it was
// generated so far (0: only in the prompt).
struct PenaltyToken {
  int32_t id = 0;
  int32_t output_count = 0;
};

struct LogitBias {
  int32_t id = 0;
  float bias = 0.f;
};

// How to sample one row. The spans are the caller's and must outlive the sampling call.
struct RowSampling {
  float temperature = 0.f;  // <= 0: greedy
  float top_p = 1.f;        // (0, 1]
  int top_k = 0;            // 0: off
  uint64_t seed = 0;
  int64_t step = 0;      // index of the output token being sampled (0: the first)
  int num_logprobs = 0;  // top-N log-probabilities to report, [0, kMaxTopLogprobs]
  float min_p = 0.f;     // [0, 1]; 0: off
  float repetition_penalty = 1.f;                 // > 0; 1: off
  float presence_penalty = 0.f;                   // finite
  float frequency_penalty = 0.f;                  // finite
  absl::Span<const PenaltyToken> penalty_tokens;  // distinct ids
  absl::Span<const LogitBias> logit_bias;         // ids strictly increasing, finite biases
  absl::Span<const int32_t> banned_ids;           // strictly increasing, fewer than vocab
};

// Structured output's token mask on one row of a batch of logits: the tokens whose bit is clear
// in allowed_words (bit t % 32 of word t / 32; (vocab + 31) / 32 words) get -inf before anything
// else, so processing, sampling and the logprobs all see the masked row (vLLM's order).
struct RowMask {
  int row = 0;
  absl::Span<const int32_t> allowed_words;
};

// The mask on one row of host logits (the CPU backend's MaskLogits, and the reference).
void MaskRowOnHost(float* logits, int vocab, absl::Span<const int32_t> allowed_words);

// InvalidArgument unless each mask's row is in [0, rows), no row twice, and its words cover
// vocab. Backends call it before masking.
absl::Status ValidateRowMasks(int rows, int vocab, absl::Span<const RowMask> masks);

// Whether the row's logits are processed before sampling (a bias, a ban or an active penalty).
bool HasLogitProcessing(const RowSampling& params);

struct SampledToken {
  int32_t id = -1;
  float logprob = 0.f;  // log-softmax of the raw logits (temperature 1), as OpenAI reports
  std::vector<std::pair<int32_t, float>> top_logprobs;  // best first
};

// InvalidArgument unless rows >= 0, vocab > 0 and every row's parameters are in range
// (params.size() == rows). Backends call it before sampling.
absl::Status ValidateRowSampling(int rows, int vocab, absl::Span<const RowSampling> params);

// The logit processing above, in place on one row of host logits.
void ProcessLogitsOnHost(float* logits, int vocab, const RowSampling& params);

// Samples one row of host logits (the CPU backend's SampleRows, row by row).
SampledToken SampleRowOnHost(const float* logits, int vocab, const RowSampling& params);

// The logprob of `token` in one row of host logits (log-softmax of the raw logits, as sampled
// tokens report theirs) and the row's `num_logprobs` best alternatives, best first (ties: the
// smaller id): what SampleRowOnHost reports for a row that drew `token`.
SampledToken ScoreRowOnHost(const float* logits, int vocab, int32_t token, int num_logprobs);

}  // namespace duet::compute
