// Paged-KV CPU kernels: writing new K/V rows into cache slots, and causal paged attention
// (GQA, block tables, mixed prefill / decode / chunked-prefill sequences, sliding window), for
// every KV dtype (f32, bf16, f16, int8, fp8; kv_codec.h defines how each is stored).
//
// Attention is tiled: a work item is (a tile of a sequence's query rows, a kv head), whose
// queries (up to 48: rows x the kv head's GQA q heads) run together over the keys in blocks of
// 64 positions aligned to multiples of 64. Per block, the K rows (read in place for f32, decoded
// otherwise) are transposed once into a [head_dim][64] tile, every query's 64 scores come from a
// register tile (queries x keys, an FMA chain over head_dim), each query takes an online-softmax
// step (running max and sum, its accumulator rescaled), and the block's V rows are added into
// every query's accumulator. Keys are split at multiples of 512 positions: the softmax runs
// over each split on its own and the splits' states merge in order, so a decode step of a few
// sequences can run its splits on several cores. The operations per (query, element) are fixed
// by the query's own keys and the block and split boundaries (attention_kernels.h), never by the
// tiling, the batch, the thread count or the CPU path (scalar, AVX2, AVX-512 give the same
// bits), so a row's output is the same alone, in any batch, in decode or in a prefill chunk.
//
//   WriteKvRows(cache, layer, k, v, slots, n);
//   PagedAttention(&pool, cache, layer, q, seqs, params, out, CpuIsa::kAvx512);
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "common/base/thread_pool.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cpu/cpu_isa.h"
#include "common/kv/kv_layout.h"

namespace duet::compute::cpu {

// Stores k[i] and v[i] ([kv_heads * head_dim] each) in slot slots[i] of `layer`, encoded in the
// cache's dtype (EncodeKvToken).
void WriteKvRows(const kv::KvCacheView& cache, int layer, const float* k, const float* v,
                 const int64_t* slots, int n);

// isa: the kernel path (which the caller has checked the CPU runs, cpu_isa.h).
void PagedAttention(ThreadPool* pool, const kv::KvCacheView& cache, int layer, const float* q,
                    absl::Span<const AttentionSeq> seqs, const AttentionParams& params, float* out,
                    CpuIsa isa);

}  // namespace duet::compute::cpu
