// Launchers for duet's CUDA kernels (compiled by nvcc in *.cu; callable from host C++). All take
// device pointers and a stream and only enqueue work; launch errors surface through
// cudaGetLastError(), which CudaBackend checks after each call. Layouts follow
// ComputeBackend: activations float32 row-major, KV cache per kv::KvLayout.
//
//   LaunchRmsNorm(x, w, rows, dim, 1e-5f, y, stream);
//   LaunchPagedAttention(cache_args, q, meta, out, partials, stream);
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace duet::compute::cuda {

enum class ElemType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// ---- elementwise (elementwise_kernels.cu)
void LaunchEmbed(const float* table, int dim, const int32_t* ids, int n, float* out,
                 cudaStream_t s);
void LaunchRmsNorm(const float* x, const float* weight, int rows, int dim, float eps, float* y,
                   cudaStream_t s);
// x += residual; y = RmsNorm(x).
void LaunchAddRmsNorm(float* x, const float* residual, const float* weight, int rows, int dim,
                      float eps, float* y, cudaStream_t s);
void LaunchAdd(float* y, const float* x, int64_t n, cudaStream_t s);
// y[r, j] += bias[j] for r < rows, j < cols.
void LaunchAddBias(float* y, const float* bias, int rows, int cols, cudaStream_t s);
void LaunchRope(float* x, int rows, int num_heads, int head_dim, const int32_t* positions,
                const float* inv_freq, int num_freq, cudaStream_t s);
void LaunchSwiGlu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t s);
void LaunchGeluTanhGlu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t s);
// dst (f16/bf16/f32) = src (f32), n elements.
void LaunchConvertFromF32(const float* src, void* dst, ElemType dst_type, int64_t n,
                          cudaStream_t s);
// dst = UniformFromHash(seed, i, scale) for i < n (see uniform_hash.h).
void LaunchFillUniform(void* dst, ElemType type, int64_t n, uint64_t seed, float scale,
                       cudaStream_t s);

// ---- sampling (sampling_kernels.cu; the algorithm of common/sampling/sampling.h)
// Structured output: logits[rows[m] * vocab + t] = -inf for every token t whose bit is clear in
// mask m (words[m * ((vocab + 31) / 32) ...], compute::RowMask's layout), m < num_masks
// (everything in device memory).
void LaunchMaskRows(float* logits, int vocab, const int32_t* rows, const int32_t* words,
                    int num_masks, cudaStream_t s);
// out[r] = argmax_j logits[r, j] (lowest index on ties).
void LaunchArgMax(const float* logits, int rows, int vocab, int32_t* out, cudaStream_t s);

inline constexpr int kDevMaxTopLogprobs = 20;  // == compute::kMaxTopLogprobs (static_assert'ed)

// One row's sampling parameters (compute::RowSampling) as the kernel reads them.
struct DevRowSampling {
  uint64_t seed = 0;
  int64_t step = 0;
  float temperature = 0.f;
  float top_p = 1.f;
  int32_t top_k = 0;
  int32_t num_logprobs = 0;
  // Segment of this row's sorted candidates (LaunchGatherRows + SortSegmentsDescending); -1 for
  // rows that need none (greedy). Required for temperature > 0; sorted from the processed row
  // when the row has one.
  int32_t sorted_index = -1;
  // Segment of the raw row sorted, for the top logprobs (required for num_logprobs > 0): the
  // same as sorted_index unless the row is processed.
  int32_t logprob_index = -1;
  float min_p = 0.f;
  float repetition_penalty = 1.f;
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  // Row of the processed logits (LaunchProcessRows); -1: sample from the raw row.
  int32_t processed_index = -1;
  // This row's logit processing inputs: [begin, begin + count) of the arrays LaunchProcessRows
  // takes.
  int32_t bias_begin = 0;
  int32_t bias_count = 0;
  int32_t banned_begin = 0;
  int32_t banned_count = 0;
  int32_t penalty_begin = 0;
  int32_t penalty_count = 0;
};

// compute::LogitBias and compute::PenaltyToken as the kernel reads them.
struct DevLogitBias {
  int32_t id;
  float bias;
};
struct DevPenaltyToken {
  int32_t id;
  int32_t output_count;
};

struct DevSampledRow {
  int32_t id;
  float logprob;
  int32_t top_ids[kDevMaxTopLogprobs];  // the first min(num_logprobs, vocab) are set
  float top_logprobs[kDevMaxTopLogprobs];
};

// processed[i * vocab + j] = logits[processed_rows[i] * vocab + j], then the logit processing of
// common/sampling/sampling.h with params[processed_rows[i]]'s inputs (bias, banned, penalties),
// for i < num_processed (everything in device memory).
void LaunchProcessRows(const float* logits, int vocab, const DevRowSampling* params,
                       const int32_t* processed_rows, int num_processed, const DevLogitBias* biases,
                       const int32_t* banned, const DevPenaltyToken* penalties, float* processed,
                       cudaStream_t s);
// keys[s * vocab + j] = source row of segment s at j and ids[s * vocab + j] = j for
// s < num_segments (segment_rows in device memory): segment_rows[s] = r >= 0 is logits' row r,
// -(i + 1) is processed's row i.
void LaunchGatherRows(const float* logits, const float* processed, int vocab,
                      const int32_t* segment_rows, int num_segments, float* keys, int32_t* ids,
                      cudaStream_t s);
// Sorts each segment [offsets[s], offsets[s + 1]) of (keys[0], ids[0]) by key, descending and
// stable (CUB segmented radix sort), ping-ponging with (keys[1], ids[1]): the result is in
// (keys[*selector], ids[*selector]). With temp == nullptr only sets *temp_bytes (no work).
// num_segments * vocab < 2^31; offsets (device memory) has num_segments + 1 entries.
cudaError_t SortSegmentsDescending(void* temp, size_t* temp_bytes, float* keys[2], int32_t* ids[2],
                                   int* selector, int num_segments, int vocab,
                                   const int32_t* offsets, cudaStream_t s);
// One token per row of logits [rows, vocab]: argmax (of the processed row where there is one)
// for greedy rows, else the walk over the row's sorted candidates; logprob and top logprobs from
// log-softmax of the raw row.
void LaunchSampleRows(const float* logits, const float* processed, int rows, int vocab,
                      const DevRowSampling* params, const float* sorted_keys,
                      const int32_t* sorted_ids, DevSampledRow* out, cudaStream_t s);

// ---- KV cache and attention (attention_kernels.cu, prefill_tensor_kernels.cu)
// Element types of a KV cache (kv::KvDtype). kInt8 and kFp8E4M3 (OCP E4M3FN) store codes with
// one f32 scale per (token, kv head), as kv::KvLayout lays them out (kv_quant.h).
enum class KvElemType : int { kF32 = 0, kF16 = 1, kBF16 = 2, kInt8 = 3, kFp8E4M3 = 4 };

struct KvCacheArgs {
  void* base = nullptr;      // the pool's region (device memory)
  KvElemType dtype = KvElemType::kF32;
  int64_t num_blocks = 0;    // blocks per layer
  int layer = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// k, v: [n, kv_heads * head_dim] f32; slots[n] = block * block_size + offset. int8/fp8 caches
// get each (token, kv head) quantized as cpu::EncodeKvToken does (the same codes and scales).
void LaunchWriteKv(const KvCacheArgs& cache, const float* k, const float* v, const int64_t* slots,
                   int n, cudaStream_t s);

// Per-sequence metadata of one attention call (device copy of AttentionSeq).
struct DevSeq {
  int32_t q_start;
  int32_t q_len;
  int32_t context_len;
  int32_t table_offset;  // into the flattened block tables
};

// One attention call's metadata, device pointers into one uploaded buffer.
struct AttentionMeta {
  const DevSeq* seqs = nullptr;
  const int32_t* tables = nullptr;      // flattened block tables
  // Prefill path: tiles of up to kPrefillTileRows query rows of one sequence: (seq, first row).
  const int2* prefill_tiles = nullptr;
  int num_prefill_tiles = 0;
  // Decode path: one query row each: (seq, row in seq, splits, unused).
  const int4* decode_rows = nullptr;
  int num_decode_rows = 0;
  int max_splits = 1;                   // max over decode rows of their split count
  bool tensor_core_prefill = false;     // prefill tiles of kTensorPrefillTileRows (see below)
  int num_q_heads = 0;
  float scale = 0.f;
  int sliding_window = 0;
};

inline constexpr int kPrefillTileRows = 32;
// The tensor-core prefill kernel (bf16 mma.sync through WMMA, fp32 accumulators) takes tiles of
// 64 query rows and head_dim 64 or 128; the host picks it with BackendOptions::cuda_attention.
inline constexpr int kTensorPrefillTileRows = 64;
bool TensorPrefillSupports(int head_dim);
// Keys per decode split: a row's split count is ceil(keys / kDecodeSplitKeys), a function of
// its own context only, so its result never depends on the batch.
inline constexpr int kDecodeSplitKeys = 256;
// Sequences with q_len <= this go row by row through the decode (split-K) kernel.
inline constexpr int kDecodePathMaxQLen = 4;

// Floats of decode partials the call needs: rows * q_heads * max_splits * (head_dim + 2).
int64_t DecodePartialFloats(const AttentionMeta& meta, int head_dim);
// Largest supported head_dim.
inline constexpr int kMaxHeadDim = 256;

// q, out: [rows, num_q_heads * head_dim]. partials: DecodePartialFloats floats (or null when
// there are no decode rows). Returns false for an unsupported head_dim.
bool LaunchPagedAttention(const KvCacheArgs& cache, const float* q, const AttentionMeta& meta,
                          float* out, float* partials, cudaStream_t s);
// The tensor-core prefill kernel alone (called by LaunchPagedAttention when
// meta.tensor_core_prefill); false for an unsupported head_dim.
bool LaunchTensorPrefill(const KvCacheArgs& cache, const float* q, const AttentionMeta& meta,
                         float* out, cudaStream_t s);

}  // namespace duet::compute::cuda
