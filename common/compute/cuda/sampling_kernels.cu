// Sampling kernels: the logit processing (bias, bans, penalties), greedy argmax, and temperature
// / top-k / min-p / top-p sampling with the chosen token's log-probability and the top-N
// alternatives: common/sampling/sampling.h's algorithm on the device, so that a decode step copies
// back a few bytes per row instead of [rows, vocab].
//
// The processing writes a copy of each processed row (the raw row stays for the logprobs); its
// inputs are sparse (a few biases, bans and penalty tokens per row), one thread per entry, in
// float with the CPU's operations spelled out (__fadd_rn, __fdiv_rn, __fmul_rn, __fmaf_rn,
// __fsub_rn: no contraction, no fast-math division), so the processed rows are bit-equal.
//
// Why a sort. The CPU algorithm is defined on the candidates sorted by (logit desc, id asc):
// top-k keeps a prefix of that order, top-p the shortest prefix that reaches the mass, and the
// draw walks the kept prefix. A stable segmented radix sort (CUB) of each sampled row's
// (logit, id) pairs, ids ascending on input, reproduces exactly that order (CUB's radix sort is
// stable and treats -0.0 and +0.0 as equal, as the CPU's comparison does); after it every cut
// and the walk are block-wide prefix sums, and the top-N logprobs are the first N entries. A
// threshold/pivot search would avoid the sort but has to re-derive the tie order and the walk
// from repeated passes over the unsorted row, with more ways to disagree with the CPU; the sort
// costs a few bandwidth-bound passes over 8 bytes per candidate, runs only for rows that need it
// (temperature > 0 or top logprobs), and greedy rows take the argmax reduction alone.
// Sums are in double, like the CPU's; their order differs, so a draw within rounding distance of
// a cumulative boundary may pick the neighbouring candidate (tests/gpu/cuda_sampling_test.cc).
#include <math_constants.h>

#include <cfloat>
#include <climits>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <cub/util_type.cuh>

#include "common/base/uniform_hash.h"
#include "common/compute/cuda/device_types.cuh"
#include "common/compute/cuda/kernels.h"

namespace duet::compute::cuda {
namespace {

constexpr int kThreads = 256;  // every kernel here runs kThreads threads per block
constexpr int kScanItems = 4;  // candidates per thread per prefix-scan chunk
constexpr int kScanChunk = kThreads * kScanItems;
using BlockScanD = cub::BlockScan<double, kThreads>;
using BlockReduceD = cub::BlockReduce<double, kThreads>;

struct SampleShared {
  union {
    BlockScanD::TempStorage scan;
    BlockReduceD::TempStorage reduce;
  };
  double sum;
  double found_prefix;
  int found;
  float arg_vals[kThreads / 32];
  int arg_idxs[kThreads / 32];
  int arg_best;
};

// Index of the largest of row[0, n) (lowest index on ties; 0 when nothing beats -FLT_MAX, as on
// the CPU), returned to every thread.
__device__ int BlockArgMax(const float* __restrict__ row, int n, SampleShared& sh) {
  float best = -FLT_MAX;
  int best_i = INT_MAX;
  for (int j = threadIdx.x; j < n; j += kThreads) {
    const float v = row[j];
    if (v > best || (v == best && j < best_i)) {
      best = v;
      best_i = j;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (ov > best || (ov == best && oi < best_i)) {
      best = ov;
      best_i = oi;
    }
  }
  __syncthreads();  // earlier readers of sh.arg_* are done
  if (threadIdx.x % 32 == 0) {
    sh.arg_vals[threadIdx.x / 32] = best;
    sh.arg_idxs[threadIdx.x / 32] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      const float v = sh.arg_vals[w];
      const int i = sh.arg_idxs[w];
      if (v > best || (v == best && i < best_i)) {
        best = v;
        best_i = i;
      }
    }
    sh.arg_best = best_i == INT_MAX ? 0 : best_i;
  }
  __syncthreads();
  return sh.arg_best;
}

// Sum of v over the block, returned to every thread.
__device__ double BlockSumAll(double v, SampleShared& sh) {
  __syncthreads();  // earlier users of sh.reduce / sh.scan / sh.sum are done
  const double s = BlockReduceD(sh.reduce).Sum(v);
  if (threadIdx.x == 0) sh.sum = s;
  __syncthreads();
  return sh.sum;
}

struct Found {
  int index;      // first i < n whose inclusive prefix sum satisfies the predicate; INT_MAX: none
  double prefix;  // that prefix sum
};

// Scans weight(0), weight(1), ... weight(n - 1) in chunks of kScanChunk (kScanItems
// consecutive candidates per thread, CUB's blocked arrangement) and stops at the first index
// whose inclusive prefix sum satisfies pred. Every thread gets the result.
template <typename Weight, typename Pred>
__device__ Found FirstPrefix(int n, Weight weight, Pred pred, SampleShared& sh) {
  __syncthreads();  // earlier readers of sh.found / sh.reduce are done
  if (threadIdx.x == 0) {
    sh.found = INT_MAX;
    sh.found_prefix = 0.0;
  }
  __syncthreads();
  double carry = 0.0;
  for (int base = 0; base < n; base += kScanChunk) {
    const int first = base + static_cast<int>(threadIdx.x) * kScanItems;
    double w[kScanItems];
#pragma unroll
    for (int k = 0; k < kScanItems; ++k) w[k] = first + k < n ? weight(first + k) : 0.0;
    double prefix[kScanItems];
    double chunk_total;
    BlockScanD(sh.scan).InclusiveSum(w, prefix, chunk_total);
#pragma unroll
    for (int k = 0; k < kScanItems; ++k) prefix[k] += carry;
    for (int k = 0; k < kScanItems; ++k) {
      if (first + k < n && pred(prefix[k])) {
        atomicMin(&sh.found, first + k);  // this thread's first hit; the block's least wins
        break;
      }
    }
    __syncthreads();
    const int f = sh.found;  // the same in every thread: the break below is uniform
    if (f != INT_MAX) {
#pragma unroll
      for (int k = 0; k < kScanItems; ++k) {
        if (first + k == f) sh.found_prefix = prefix[k];
      }
      break;
    }
    carry += chunk_total;  // every thread gets the block aggregate
    __syncthreads();       // all have read sh.found and the scan storage before the next chunk
  }
  __syncthreads();
  return Found{sh.found, sh.found_prefix};
}

// Temperature sampling over one row's sorted candidates (keys desc, ids asc on ties):
// SampleWithTemperature in sampling.cc, with the sequential sums as block reductions/scans.
__device__ int32_t SampleSorted(const float* __restrict__ keys, const int32_t* __restrict__ ids,
                                int vocab, const DevRowSampling& p, SampleShared& sh) {
  int n = p.top_k > 0 ? min(p.top_k, vocab) : vocab;
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const double max_l = keys[0];
  auto weight = [&](int i) { return exp((static_cast<double>(keys[i]) - max_l) * inv_t); };
  if (p.min_p > 0.f) {
    // The first candidate whose weight is below min_p ends the kept prefix (as the CPU's walk).
    const double min_p = p.min_p;
    __syncthreads();  // earlier readers of sh.found are done
    if (threadIdx.x == 0) sh.found = INT_MAX;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += kThreads) {
      if (weight(i) < min_p) {
        atomicMin(&sh.found, i);
        break;
      }
    }
    __syncthreads();
    if (sh.found < n) n = max(sh.found, 1);
  }
  double part = 0.0;
  for (int i = threadIdx.x; i < n; i += kThreads) part += weight(i);
  const double sum = BlockSumAll(part, sh);
  int keep = n;
  double kept_sum = sum;
  if (p.top_p < 1.f) {
    const double top_p = p.top_p;
    const Found cut = FirstPrefix(
        n, weight, [&](double prefix) { return prefix / sum >= top_p; }, sh);
    if (cut.index < n) {
      keep = cut.index + 1;
      kept_sum = cut.prefix;
    }
  }
  const double u = SamplingUniform(p.seed, p.step) * kept_sum;
  const Found pick = FirstPrefix(
      keep, weight, [&](double prefix) { return u < prefix; }, sh);
  return ids[pick.index < keep ? pick.index : keep - 1];
}

// One block per processed row: ProcessLogitsOnHost on a copy of the raw row.
__global__ void __launch_bounds__(kThreads)
    ProcessRowsKernel(const float* __restrict__ logits, int vocab,
                      const DevRowSampling* __restrict__ params,
                      const int32_t* __restrict__ processed_rows,
                      const DevLogitBias* __restrict__ biases, const int32_t* __restrict__ banned,
                      const DevPenaltyToken* __restrict__ penalties,
                      float* __restrict__ processed) {
  const int r = processed_rows[blockIdx.x];
  const DevRowSampling p = params[r];
  const float* row = logits + static_cast<int64_t>(r) * vocab;
  float* out = processed + static_cast<int64_t>(blockIdx.x) * vocab;
  for (int j = threadIdx.x; j < vocab; j += kThreads) out[j] = row[j];
  __syncthreads();
  for (int i = threadIdx.x; i < p.bias_count; i += kThreads) {  // distinct ids
    const DevLogitBias b = biases[p.bias_begin + i];
    out[b.id] = __fadd_rn(out[b.id], b.bias);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < p.banned_count; i += kThreads) {
    out[banned[p.banned_begin + i]] = -CUDART_INF_F;
  }
  __syncthreads();
  const float rep = p.repetition_penalty;
  for (int i = threadIdx.x; i < p.penalty_count; i += kThreads) {  // distinct ids
    const DevPenaltyToken t = penalties[p.penalty_begin + i];
    float l = out[t.id];
    if (rep != 1.f) l = l > 0.f ? __fdiv_rn(l, rep) : __fmul_rn(l, rep);
    if (t.output_count > 0) {
      l = __fsub_rn(__fmaf_rn(-p.frequency_penalty, static_cast<float>(t.output_count), l),
                    p.presence_penalty);
    }
    out[t.id] = l;
  }
}

// One block per row.
__global__ void __launch_bounds__(kThreads)
    SampleRowsKernel(const float* __restrict__ logits, const float* __restrict__ processed,
                     int vocab, const DevRowSampling* __restrict__ params,
                     const float* __restrict__ sorted_keys, const int32_t* __restrict__ sorted_ids,
                     DevSampledRow* __restrict__ out) {
  __shared__ SampleShared sh;
  const int r = blockIdx.x;
  const float* row = logits + static_cast<int64_t>(r) * vocab;
  const DevRowSampling p = params[r];
  const float* keys = nullptr;
  const int32_t* ids = nullptr;
  if (p.sorted_index >= 0) {
    keys = sorted_keys + static_cast<int64_t>(p.sorted_index) * vocab;
    ids = sorted_ids + static_cast<int64_t>(p.sorted_index) * vocab;
  }
  const float* lp_keys = nullptr;
  const int32_t* lp_ids = nullptr;
  if (p.logprob_index >= 0) {
    lp_keys = sorted_keys + static_cast<int64_t>(p.logprob_index) * vocab;
    lp_ids = sorted_ids + static_cast<int64_t>(p.logprob_index) * vocab;
  }
  const int argmax = BlockArgMax(row, vocab, sh);
  // log Z of the raw logits (temperature 1), as SampleRowOnHost computes it.
  const double max_l = row[argmax];
  double part = 0.0;
  for (int j = threadIdx.x; j < vocab; j += kThreads) {
    part += exp(static_cast<double>(row[j]) - max_l);
  }
  const double log_z = max_l + log(BlockSumAll(part, sh));
  int32_t id = argmax;
  if (p.temperature > 0.f && keys != nullptr) {
    id = SampleSorted(keys, ids, vocab, p, sh);
  } else if (p.processed_index >= 0) {
    id = BlockArgMax(processed + static_cast<int64_t>(p.processed_index) * vocab, vocab, sh);
  }
  DevSampledRow& o = out[r];
  if (threadIdx.x == 0) {
    o.id = id;
    o.logprob = static_cast<float>(static_cast<double>(row[id]) - log_z);
  }
  const int num_top = lp_keys != nullptr ? min(min(p.num_logprobs, vocab), kDevMaxTopLogprobs) : 0;
  if (static_cast<int>(threadIdx.x) < num_top) {
    o.top_ids[threadIdx.x] = lp_ids[threadIdx.x];
    o.top_logprobs[threadIdx.x] =
        static_cast<float>(static_cast<double>(lp_keys[threadIdx.x]) - log_z);
  }
}

// keys[i] = (source row of the segment)[j], ids[i] = j, for i = segment * vocab + j < n.
__global__ void GatherRowsKernel(const float* __restrict__ logits,
                                 const float* __restrict__ processed, int vocab,
                                 const int32_t* __restrict__ segment_rows, int64_t n,
                                 float* __restrict__ keys, int32_t* __restrict__ ids) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t segment = i / vocab;
    const int j = static_cast<int>(i - segment * vocab);
    const int32_t src = segment_rows[segment];
    keys[i] = src >= 0 ? logits[static_cast<int64_t>(src) * vocab + j]
                       : processed[static_cast<int64_t>(-src - 1) * vocab + j];
    ids[i] = j;
  }
}

// One block per row.
__global__ void __launch_bounds__(kThreads)
    ArgMaxKernel(const float* __restrict__ logits, int vocab, int32_t* __restrict__ out) {
  __shared__ SampleShared sh;
  const int best = BlockArgMax(logits + static_cast<int64_t>(blockIdx.x) * vocab, vocab, sh);
  if (threadIdx.x == 0) out[blockIdx.x] = best;
}

// Structured output's masks: block (x, m) covers kThreads tokens of mask m's row; a token whose
// bit is clear gets -inf.
__global__ void __launch_bounds__(kThreads)
    MaskRowsKernel(float* __restrict__ logits, int vocab, const int32_t* __restrict__ rows,
                   const int32_t* __restrict__ words, int words_per_row) {
  const int t = blockIdx.x * kThreads + threadIdx.x;
  if (t >= vocab) return;
  const int m = blockIdx.y;
  const uint32_t word =
      static_cast<uint32_t>(words[static_cast<int64_t>(m) * words_per_row + (t >> 5)]);
  if (((word >> (t & 31)) & 1u) == 0) {
    logits[static_cast<int64_t>(rows[m]) * vocab + t] = -CUDART_INF_F;
  }
}

}  // namespace

void LaunchMaskRows(float* logits, int vocab, const int32_t* rows, const int32_t* words,
                    int num_masks, cudaStream_t s) {
  if (num_masks <= 0 || vocab <= 0) return;
  const dim3 grid((vocab + kThreads - 1) / kThreads, num_masks);
  MaskRowsKernel<<<grid, kThreads, 0, s>>>(logits, vocab, rows, words, (vocab + 31) / 32);
}

void LaunchArgMax(const float* logits, int rows, int vocab, int32_t* out, cudaStream_t s) {
  if (rows <= 0 || vocab <= 0) return;
  ArgMaxKernel<<<rows, kThreads, 0, s>>>(logits, vocab, out);
}

void LaunchProcessRows(const float* logits, int vocab, const DevRowSampling* params,
                       const int32_t* processed_rows, int num_processed, const DevLogitBias* biases,
                       const int32_t* banned, const DevPenaltyToken* penalties, float* processed,
                       cudaStream_t s) {
  if (num_processed <= 0 || vocab <= 0) return;
  ProcessRowsKernel<<<num_processed, kThreads, 0, s>>>(logits, vocab, params, processed_rows,
                                                       biases, banned, penalties, processed);
}

void LaunchGatherRows(const float* logits, const float* processed, int vocab,
                      const int32_t* segment_rows, int num_segments, float* keys, int32_t* ids,
                      cudaStream_t s) {
  const int64_t n = static_cast<int64_t>(num_segments) * vocab;
  if (n <= 0) return;
  GatherRowsKernel<<<BlocksFor(n, kThreads), kThreads, 0, s>>>(logits, processed, vocab,
                                                               segment_rows, n, keys, ids);
}

cudaError_t SortSegmentsDescending(void* temp, size_t* temp_bytes, float* keys[2], int32_t* ids[2],
                                   int* selector, int num_segments, int vocab,
                                   const int32_t* offsets, cudaStream_t s) {
  cub::DoubleBuffer<float> k(keys[0], keys[1]);
  cub::DoubleBuffer<int32_t> v(ids[0], ids[1]);
  const cudaError_t err = cub::DeviceSegmentedRadixSort::SortPairsDescending(
      temp, *temp_bytes, k, v, num_segments * vocab, num_segments, offsets, offsets + 1,
      /*begin_bit=*/0, /*end_bit=*/32, s);
  // Keys and values move together; a mismatch would mean pairs were split.
  *selector = k.selector == v.selector ? k.selector : -1;
  return err;
}

void LaunchSampleRows(const float* logits, const float* processed, int rows, int vocab,
                      const DevRowSampling* params, const float* sorted_keys,
                      const int32_t* sorted_ids, DevSampledRow* out, cudaStream_t s) {
  if (rows <= 0 || vocab <= 0) return;
  SampleRowsKernel<<<rows, kThreads, 0, s>>>(logits, processed, vocab, params, sorted_keys,
                                             sorted_ids, out);
}

}  // namespace duet::compute::cuda
