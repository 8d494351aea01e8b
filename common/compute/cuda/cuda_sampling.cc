// The CUDA backend's sampling: greedy argmax and SampleRows (common/sampling/sampling.h's
// algorithm on the device; only the sampled tokens and their log-probabilities reach the host).
#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/compute/cuda/cuda_backend.h"
#include "common/compute/cuda/cuda_check.h"

namespace duet::compute::cuda {

absl::StatusOr<std::vector<int32_t>> CudaBackend::ArgMax(const float* logits, int rows, int vocab) {
  std::vector<int32_t> out(rows > 0 ? rows : 0);
  if (rows <= 0) return out;
  auto lock = Enter();
  if (!Reserve(&argmax_out_, static_cast<size_t>(rows) * sizeof(int32_t))) return status();
  LaunchArgMax(logits, rows, vocab, argmax_out_.as<int32_t>(), stream_.get());
  DUET_CUDA_CHECK(cudaGetLastError());
  DUET_CUDA_CHECK(cudaMemcpyAsync(out.data(), argmax_out_.get(), rows * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, stream_.get()));
  DUET_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  return out;
}

absl::StatusOr<std::vector<SampledToken>> CudaBackend::SampleRows(
    const float* logits, int rows, int vocab, absl::Span<const RowSampling> params) {
  DUET_RETURN_IF_ERROR(ValidateRowSampling(rows, vocab, params));
  std::vector<SampledToken> out(rows);
  if (rows == 0) return out;
  // Per-row parameters, the processing inputs, then the sorted rows' segment offsets
  // (s * vocab, s <= segments), their source rows and the processed rows' numbers, uploaded in
  // one copy.
  std::vector<DevRowSampling> dev(rows);
  std::vector<int32_t> segment_rows;  // r: logits' row r; -(i + 1): processed row i
  std::vector<int32_t> processed_rows;
  std::vector<DevLogitBias> biases;
  std::vector<int32_t> banned;
  std::vector<DevPenaltyToken> penalties;
  for (int r = 0; r < rows; ++r) {
    const RowSampling& p = params[r];
    DevRowSampling& d = dev[r];
    d = DevRowSampling{.seed = p.seed,
                       .step = p.step,
                       .temperature = p.temperature,
                       .top_p = p.top_p,
                       .top_k = p.top_k,
                       .num_logprobs = p.num_logprobs,
                       .min_p = p.min_p,
                       .repetition_penalty = p.repetition_penalty,
                       .presence_penalty = p.presence_penalty,
                       .frequency_penalty = p.frequency_penalty};
    const bool processed = HasLogitProcessing(p);
    if (processed) {
      d.processed_index = static_cast<int32_t>(processed_rows.size());
      processed_rows.push_back(r);
      d.bias_begin = static_cast<int32_t>(biases.size());
      d.bias_count = static_cast<int32_t>(p.logit_bias.size());
      for (const LogitBias& b : p.logit_bias) biases.push_back({b.id, b.bias});
      d.banned_begin = static_cast<int32_t>(banned.size());
      d.banned_count = static_cast<int32_t>(p.banned_ids.size());
      banned.insert(banned.end(), p.banned_ids.begin(), p.banned_ids.end());
      d.penalty_begin = static_cast<int32_t>(penalties.size());
      d.penalty_count = static_cast<int32_t>(p.penalty_tokens.size());
      for (const PenaltyToken& t : p.penalty_tokens) penalties.push_back({t.id, t.output_count});
    }
    if (p.temperature > 0.f) {
      d.sorted_index = static_cast<int32_t>(segment_rows.size());
      segment_rows.push_back(processed ? -(d.processed_index + 1) : r);
    }
    if (p.num_logprobs > 0) {
      if (d.sorted_index >= 0 && !processed) {
        d.logprob_index = d.sorted_index;
      } else {
        d.logprob_index = static_cast<int32_t>(segment_rows.size());
        segment_rows.push_back(r);
      }
    }
  }
  const int segments = static_cast<int>(segment_rows.size());
  const int num_processed = static_cast<int>(processed_rows.size());
  const int64_t candidates = int64_t{segments} * vocab;
  if (candidates > INT_MAX || int64_t{num_processed} * vocab > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("SampleRows: ", segments, " sampled rows of ",
                                                   vocab, " logits exceed 2^31 candidates"));
  }
  std::vector<int32_t> offsets(segments + 1);
  for (int s = 0; s <= segments; ++s) offsets[s] = s * vocab;
  // Every part starts 8-byte aligned.
  std::vector<uint8_t> meta;
  auto append = [&meta](const void* data, size_t bytes) {
    const size_t at = (meta.size() + 7) / 8 * 8;
    meta.resize(at + bytes);
    if (bytes > 0) std::memcpy(meta.data() + at, data, bytes);
    return at;
  };
  const size_t params_at = append(dev.data(), dev.size() * sizeof(DevRowSampling));
  const size_t offsets_at = append(offsets.data(), offsets.size() * sizeof(int32_t));
  const size_t segment_rows_at = append(segment_rows.data(), segment_rows.size() * sizeof(int32_t));
  const size_t processed_rows_at =
      append(processed_rows.data(), processed_rows.size() * sizeof(int32_t));
  const size_t biases_at = append(biases.data(), biases.size() * sizeof(DevLogitBias));
  const size_t banned_at = append(banned.data(), banned.size() * sizeof(int32_t));
  const size_t penalties_at = append(penalties.data(), penalties.size() * sizeof(DevPenaltyToken));

  auto lock = Enter();
  const auto* dmeta = static_cast<const uint8_t*>(Upload(kSampling, meta.data(), meta.size()));
  if (dmeta == nullptr) return status();
  const auto* dparams = reinterpret_cast<const DevRowSampling*>(dmeta + params_at);
  const auto* doffsets = reinterpret_cast<const int32_t*>(dmeta + offsets_at);
  const auto* dsegment_rows = reinterpret_cast<const int32_t*>(dmeta + segment_rows_at);
  const auto* dprocessed_rows = reinterpret_cast<const int32_t*>(dmeta + processed_rows_at);
  const auto* dbiases = reinterpret_cast<const DevLogitBias*>(dmeta + biases_at);
  const auto* dbanned = reinterpret_cast<const int32_t*>(dmeta + banned_at);
  const auto* dpenalties = reinterpret_cast<const DevPenaltyToken*>(dmeta + penalties_at);
  // Every buffer is reserved before anything is queued: Reserve may synchronise and free.
  size_t temp_bytes = 0;
  const size_t result_bytes = static_cast<size_t>(rows) * sizeof(DevSampledRow);
  if (!Reserve(&sample_results_, result_bytes)) return status();
  float* processed = nullptr;
  if (num_processed > 0) {
    if (!Reserve(&processed_logits_, static_cast<size_t>(num_processed) * vocab * sizeof(float))) {
      return status();
    }
    processed = processed_logits_.as<float>();
  }
  float* keys[2] = {nullptr, nullptr};
  int32_t* ids[2] = {nullptr, nullptr};
  if (segments > 0) {
    const size_t bytes = static_cast<size_t>(candidates) * sizeof(float);
    static_assert(sizeof(float) == sizeof(int32_t));
    for (int i = 0; i < 2; ++i) {
      if (!Reserve(&sort_keys_[i], bytes) || !Reserve(&sort_ids_[i], bytes)) return status();
      keys[i] = sort_keys_[i].as<float>();
      ids[i] = sort_ids_[i].as<int32_t>();
    }
    int selector = 0;
    DUET_CUDA_CHECK(SortSegmentsDescending(nullptr, &temp_bytes, keys, ids, &selector, segments,
                                           vocab, doffsets, stream_.get()));
    if (!Reserve(&sort_temp_, std::max<size_t>(temp_bytes, 1))) return status();
    // keys[0] / ids[0] = the sorted rows' logits and ids 0..vocab-1; the sort ping-pongs between
    // the two buffers and reports which holds the result.
    if (num_processed > 0) {
      LaunchProcessRows(logits, vocab, dparams, dprocessed_rows, num_processed, dbiases, dbanned,
                        dpenalties, processed, stream_.get());
      DUET_CUDA_CHECK(cudaGetLastError());
    }
    LaunchGatherRows(logits, processed, vocab, dsegment_rows, segments, keys[0], ids[0],
                     stream_.get());
    DUET_CUDA_CHECK(cudaGetLastError());
    DUET_CUDA_CHECK(SortSegmentsDescending(sort_temp_.get(), &temp_bytes, keys, ids, &selector,
                                           segments, vocab, doffsets, stream_.get()));
    if (selector != 0 && selector != 1) {
      return absl::InternalError("SampleRows: the sort split keys from their ids");
    }
    keys[0] = keys[selector];
    ids[0] = ids[selector];
  }
  if (segments == 0 && num_processed > 0) {  // greedy rows only: nothing sorted
    LaunchProcessRows(logits, vocab, dparams, dprocessed_rows, num_processed, dbiases, dbanned,
                      dpenalties, processed, stream_.get());
    DUET_CUDA_CHECK(cudaGetLastError());
  }
  LaunchSampleRows(logits, processed, rows, vocab, dparams, keys[0], ids[0],
                   sample_results_.as<DevSampledRow>(), stream_.get());
  DUET_CUDA_CHECK(cudaGetLastError());
  std::vector<DevSampledRow> host(rows);
  // Same stream, after the kernels; the host waits for the copy before reading.
  DUET_CUDA_CHECK(cudaMemcpyAsync(host.data(), sample_results_.get(), result_bytes,
                                  cudaMemcpyDeviceToHost, stream_.get()));
  DUET_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  for (int r = 0; r < rows; ++r) {
    const DevSampledRow& d = host[r];
    if (d.id < 0 || d.id >= vocab) {
      return absl::InternalError(absl::StrCat("SampleRows: row ", r, " sampled token ", d.id,
                                              " outside the vocabulary of ", vocab));
    }
    SampledToken& t = out[r];
    t.id = d.id;
    t.logprob = d.logprob;
    const int num_top = std::min(params[r].num_logprobs, vocab);
    for (int i = 0; i < num_top; ++i) t.top_logprobs.emplace_back(d.top_ids[i], d.top_logprobs[i]);
  }
  return out;
}

absl::Status CudaBackend::MaskLogits(float* logits, int rows, int vocab,
                                     absl::Span<const RowMask> masks) {
  DUET_RETURN_IF_ERROR(ValidateRowMasks(rows, vocab, masks));
  if (masks.empty()) return absl::OkStatus();
  // The rows, then every mask's words, uploaded in one copy.
  const size_t words = (static_cast<size_t>(vocab) + 31) / 32;
  const size_t words_at = (masks.size() * sizeof(int32_t) + 7) / 8 * 8;
  std::vector<uint8_t> meta(words_at + masks.size() * words * sizeof(int32_t));
  for (size_t m = 0; m < masks.size(); ++m) {
    std::memcpy(meta.data() + m * sizeof(int32_t), &masks[m].row, sizeof(int32_t));
    std::memcpy(meta.data() + words_at + m * words * sizeof(int32_t), masks[m].allowed_words.data(),
                words * sizeof(int32_t));
  }
  auto lock = Enter();
  const auto* dmeta = static_cast<const uint8_t*>(Upload(kTokenMasks, meta.data(), meta.size()));
  if (dmeta == nullptr) return status();
  LaunchMaskRows(logits, vocab, reinterpret_cast<const int32_t*>(dmeta),
                 reinterpret_cast<const int32_t*>(dmeta + words_at), static_cast<int>(masks.size()),
                 stream_.get());
  DUET_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace duet::compute::cuda
