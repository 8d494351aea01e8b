// Paged-KV CPU kernels: writing new K/V rows into cache slots, and causal paged attention
// (GQA, block tables, mixed prefill / decode / chunked-prefill sequences, sliding window), for
// every KV dtype (f32, bf16, f16, int8, fp8; kv_codec.h defines how each is stored). Attention
// reads f32 rows in place and decodes the others, kKeyBlock keys at a time, into a buffer that
// stays in L1; the arithmetic after decoding is the f32 path's.
//
// Attention is parallel over (tile of up to 4 query rows of one sequence, kv head) work items;
// the tile's rows and the kv head's GQA q heads share each K/V load. Each (row, q head) output
// is computed by one thread in a fixed order over its keys (DotF32 scores, max, exp and sum in
// key order, one FMA chain per element of the weighted V sum), so it depends only on that row
// and its sequence's KV, never on the tiling, the batch or the thread count.
//
//   WriteKvRows(cache, layer, k, v, slots, n);
//   PagedAttention(&pool, cache, layer, q, seqs, params, out);
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "common/base/thread_pool.h"
#include "common/compute/compute_backend.h"
#include "common/kv/kv_layout.h"

namespace duet::compute::cpu {

// Stores k[i] and v[i] ([kv_heads * head_dim] each) in slot slots[i] of `layer`, encoded in the
// cache's dtype (EncodeKvToken).
void WriteKvRows(const kv::KvCacheView& cache, int layer, const float* k, const float* v,
                 const int64_t* slots, int n);

void PagedAttention(ThreadPool* pool, const kv::KvCacheView& cache, int layer, const float* q,
                    absl::Span<const AttentionSeq> seqs, const AttentionParams& params, float* out);

// Dot product of length n with 8 interleaved partial sums (lane j takes i % 8 == j) reduced
// in a fixed order; the AVX2 and portable versions return identical bits. Exposed for tests.
float DotF32(const float* a, const float* b, int n);
float DotF32Portable(const float* a, const float* b, int n);
// out[j] = DotF32(q, k[j], n) for j < 4, bit for bit, with four independent FMA chains.
void DotF32x4(const float* q, const float* const* k, int n, float* out);

}  // namespace duet::compute::cpu
