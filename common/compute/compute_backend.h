// ComputeBackend: the kernels a Llama-family forward pass needs, behind one interface so that
// ModelRunner runs unchanged on the CPU (cpu/, always built) and on CUDA (cuda/, later).
// Activations are float32 row-major [rows, features] in buffers the backend allocates.
//
// Every kernel is batch-invariant: a row's result depends only on that row (and, for attention,
// on its own sequence's KV), never on which other rows share the call or on the thread count.
// Disaggregated token-exactness (DESIGN.md invariant 1) rests on this.
//
//   DUET_ASSIGN_OR_RETURN(auto backend, compute::CreateBackend("cpu", {}));
//   DUET_ASSIGN_OR_RETURN(auto wq, backend->PrepareMatrix(q_proj.data(), rows, cols));
//   backend->MatMul(x, m, *wq, /*bias=*/nullptr, y);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/kv/kv_layout.h"

namespace duet::compute {

// A weight matrix [rows = out_features, cols = in_features] (the Hugging Face Linear layout),
// repacked once into whatever form the backend's GEMM wants.
class PreparedMatrix {
 public:
  virtual ~PreparedMatrix() = default;
  virtual int rows() const = 0;
  virtual int cols() const = 0;
};

// One sequence of a paged-attention call.
struct AttentionSeq {
  int32_t q_start = 0;      // first row of this sequence in the packed q / out buffers
  int32_t q_len = 0;        // new tokens this step (prompt chunk for prefill, 1 for decode)
  int32_t context_len = 0;  // tokens in the cache including the q_len new ones (already written)
  const kv::BlockId* block_table = nullptr;  // blocks holding positions [0, context_len)
  int32_t num_table_blocks = 0;
};

struct AttentionParams {
  int num_q_heads = 0;
  int num_kv_heads = 0;  // num_q_heads % num_kv_heads == 0 (GQA)
  int head_dim = 0;
  float scale = 0.f;        // usually 1/sqrt(head_dim)
  int sliding_window = 0;   // 0: none; else a query at position p sees keys in (p - window, p]
};

// Rotary embedding: HF "rotate_half" convention (pairs (i, i + head_dim/2)), angle =
// position * inv_freq[i] for i < head_dim/2. inv_freq already includes rope scaling.
struct RopeParams {
  std::vector<float> inv_freq;
};

struct BackendOptions {
  int num_threads = 0;         // 0: all hardware threads
  std::string cpu_gemm = "invariant";  // cpu: "invariant" (own packed kernel) or "openblas"
};

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;
  virtual std::string name() const = 0;

  // Activation memory (host memory on cpu, device memory on cuda). Contents unspecified.
  virtual float* AllocateActivations(int64_t count) = 0;
  virtual void FreeActivations(float* p) = 0;
  // Copies between host and activation memory (plain memcpy on cpu).
  virtual void CopyToDevice(float* dst, const float* src, int64_t count) = 0;
  virtual void CopyToHost(float* dst, const float* src, int64_t count) = 0;
  // Copies within activation memory. The default suits backends whose activations are host
  // memory; device backends override it.
  virtual void CopyWithin(float* dst, const float* src, int64_t count) {
    CopyToDevice(dst, src, count);
  }
  // Waits for all queued work (no-op on cpu).
  virtual void Synchronize() {}

  // w: host float32 [rows, cols], row-major.
  virtual absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareMatrix(const float* w, int rows,
                                                                       int cols) = 0;
  // Uploads a host vector (norm weights, biases, embeddings) to backend memory; on cpu may
  // return the same pointer. The returned memory lives as long as the backend.
  virtual const float* UploadVector(const float* host, int64_t count) = 0;

  // y[m, w.rows] = x[m, w.cols] * w^T (+ bias[w.rows] if bias != nullptr).
  virtual void MatMul(const float* x, int m, const PreparedMatrix& w, const float* bias,
                      float* y) = 0;
  // y = x / rms(x) * weight, per row of `dim`; y may alias x.
  virtual void RmsNorm(const float* x, const float* weight, int rows, int dim, float eps,
                       float* y) = 0;
  // y += x, elementwise.
  virtual void Add(float* y, const float* x, int64_t n) = 0;
  // In-place rotary embedding of x [rows, num_heads * head_dim]; positions[rows].
  virtual void Rope(float* x, int rows, int num_heads, int head_dim, const int32_t* positions,
                    const RopeParams& rope) = 0;
  // out = silu(gate) * up, elementwise over n; out may alias gate or up.
  virtual void SwiGlu(const float* gate, const float* up, int64_t n, float* out) = 0;
  // out[i, :] = table[ids[i], :], table [vocab, dim] in backend memory.
  virtual void Embed(const float* table, int dim, const int32_t* ids, int n, float* out) = 0;

  // Writes rows of k and v [n, kv_heads * head_dim] into the cache at `slots`
  // (slot = block_id * block_size + offset) of `layer`.
  virtual void WriteKv(const kv::KvCacheView& cache, int layer, const float* k, const float* v,
                       const int64_t* slots, int n) = 0;
  // Causal paged attention. q [total_rows, num_q_heads * head_dim]; out has the same shape.
  // Query row i of a sequence sits at position context_len - q_len + i.
  virtual void PagedAttention(const kv::KvCacheView& cache, int layer, const float* q,
                              absl::Span<const AttentionSeq> seqs, const AttentionParams& params,
                              float* out) = 0;
};

// Creates a backend by name: "cpu" (always available) or "cuda" (when built and a GPU exists).
absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateBackend(const std::string& name,
                                                              const BackendOptions& options);

}  // namespace duet::compute
