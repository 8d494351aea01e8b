// ComputeBackend: the kernels a Llama-family forward pass needs, behind one interface so that
// ModelRunner runs unchanged on the CPU (cpu/, always built) and on CUDA (cuda/, built when nvcc
// is found and linked only into binaries that ask for it; see backend_registry.h).
// Activations are float32 row-major [rows, features] in buffers the backend allocates; index
// arrays (ids, positions, slots, block tables) are always host memory.
//
// The CPU backend's kernels are batch-invariant: a row's result depends only on that row (and,
// for attention, on its own sequence's KV), never on which other rows share the call or on the
// thread count. Disaggregated token-exactness (docs/design.md invariant 1) rests on this. On CUDA,
// attention and the elementwise kernels are per-row too, but cuBLAS picks its GEMM algorithm by
// shape, so a row's last bits may depend on the batch size (see cuda/cuda_backend.h).
//
//   DUET_ASSIGN_OR_RETURN(auto backend, compute::CreateBackend(compute::Device::kCpu, {}));
//   DUET_ASSIGN_OR_RETURN(auto wq, backend->PrepareMatrix(q_proj.data(), rows, cols));
//   backend->MatMul(x, m, *wq, /*bias=*/nullptr, y);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/compute/backend_options.h"
#include "common/compute/kv_memory.h"
#include "common/kv/kv_layout.h"
#include "common/sampling/sampling.h"

namespace duet::compute {

// A weight matrix [rows = out_features, cols = in_features] (the Hugging Face Linear layout),
// repacked once into whatever form the backend's GEMM wants.
class PreparedMatrix {
 public:
  virtual ~PreparedMatrix() = default;
  virtual int rows() const = 0;
  virtual int cols() const = 0;
  // Bytes the backend holds for it (what one GEMM over it reads); -1 when not known.
  virtual int64_t bytes() const { return -1; }
};

// One product of ComputeBackend::MatMuls: y[m, w->rows()] = x * w^T (+ bias[w->rows()]).
struct MatMulProduct {
  const PreparedMatrix* w = nullptr;
  const float* bias = nullptr;
  float* y = nullptr;
};

// The form a weight matrix is handed to PrepareStoredMatrix in: as the checkpoint stores it.
//   kF32: float [rows][cols];  kBf16 / kF16: uint16 bfloat16 / IEEE half bits [rows][cols];
//   kQ8_0 / kQ4_0 / kQ4_1 / kQ5_0 / kQ5_1: ggml blocks of 32 along cols, rows of cols / 32 blocks
//   (34 / 18 / 20 / 22 / 24 bytes each); kQ4_K / kQ5_K / kQ6_K / kQ2_K / kQ3_K: super-blocks of
//   256, rows of cols / 256 (144 / 176 / 210 / 84 / 110 bytes each). gguf_quant.h gives the
//   layouts.
enum class WeightFormat {
  kF32,
  kBf16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kF16,
  kQ5_0,
  kQ5_1,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kQ2_K,
  kQ3_K
};
const char* WeightFormatName(WeightFormat format);
// Bytes of a [rows, cols] matrix in `format` (cols a multiple of the format's block).
int64_t StoredMatrixBytes(WeightFormat format, int64_t rows, int64_t cols);

struct StoredMatrix {
  WeightFormat format = WeightFormat::kF32;
  const void* data = nullptr;
  int rows = 0;  // out_features
  int cols = 0;  // in_features
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

// A point in a backend's queued work (on cuda: an event recorded on the compute stream). The
// layer-done hook gets one per layer when ModelRunner::set_async_layer_hook(true): the KV
// sender waits on it (or stages the layer's blocks behind it) instead of the compute thread
// synchronising the device after every layer.
class WorkMarker {
 public:
  virtual ~WorkMarker() = default;
  // True once all work queued before the marker has finished.
  virtual bool Done() = 0;
  // Returns once Done(), or DeadlineExceeded at `deadline`.
  virtual absl::Status Wait(absl::Time deadline) = 0;
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
  // Marks the work queued so far. Synchronous backends (cpu) return a marker that is done.
  virtual std::shared_ptr<WorkMarker> MarkQueuedWork();
  // The first error a kernel hit since the backend was created (kernels return void; a device
  // backend records launch and runtime errors here). OK on cpu, whose kernels DUET_CHECK.
  virtual absl::Status status() const { return absl::OkStatus(); }

  // KV dtypes this backend's WriteKv and PagedAttention implement (InvalidArgument naming the
  // dtype otherwise); the cpu backend implements every kv::KvDtype.
  virtual absl::Status CheckKvDtype(kv::KvDtype dtype) const;
  // The KV dtype `--kv_dtype auto` picks: the backend's compute dtype (f32 on cpu; the GEMM
  // dtype on cuda).
  virtual kv::KvDtype NativeKvDtype() const { return kv::KvDtype::kF32; }

  // KV memory (kv_memory.h). The defaults suit backends whose kernels read host memory: zeroed,
  // 64-byte aligned host memory, and memcpy staging that is done on return.
  //
  // A KV pool's region in this backend's memory (host on cpu, device on cuda), zeroed.
  virtual absl::StatusOr<std::unique_ptr<KvMemory>> AllocateKvMemory(size_t bytes);
  // Whether AllocateKvMemory gives host-addressable memory (a transport can export it as is).
  virtual bool kv_memory_is_host() const { return true; }
  // Host memory for a pool's host mirror, zeroed; on cuda page-locked so that the staging
  // copies are asynchronous.
  virtual absl::StatusOr<std::unique_ptr<KvMemory>> AllocateHostMirror(size_t bytes);
  // Page-locks caller-owned host memory (e.g. a transport-allocated mirror) until the returned
  // object is destroyed; it must be destroyed before the memory is freed. Nothing to do on cpu.
  virtual absl::StatusOr<std::unique_ptr<HostPinning>> PinHostMemory(void* p, size_t bytes);
  // Copies `layer`'s K/V of `blocks` from `pool` to `mirror` (host memory laid out like the
  // pool: same layout and block count, same offsets), once the work before `after` (a marker of
  // this backend, e.g. LayerSpan::ready; null: none) is done. Returns a marker that is Done()
  // once the bytes are in the mirror; the compute stream is not blocked (cuda: copy stream, one
  // cudaMemcpyAsync per run of consecutive block ids). InvalidArgument for a bad layer or block
  // id, mismatched views, or a marker of another backend.
  virtual absl::StatusOr<std::shared_ptr<WorkMarker>> CopyKvToHost(
      const kv::KvCacheView& pool, int layer, absl::Span<const kv::BlockId> blocks,
      const kv::KvCacheView& mirror, const WorkMarker* after);
  // The reverse: `layer` of `blocks` from the host mirror into the pool. The returned marker
  // must be Done() before kernels read those blocks.
  virtual absl::StatusOr<std::shared_ptr<WorkMarker>> CopyKvFromHost(
      const kv::KvCacheView& mirror, int layer, absl::Span<const kv::BlockId> blocks,
      const kv::KvCacheView& pool, const WorkMarker* after);

  // w: host float32 [rows, cols], row-major.
  virtual absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareMatrix(const float* w, int rows,
                                                                       int cols) = 0;
  // A matrix in its stored form, kept in it where the backend multiplies with it directly (cpu:
  // the block formats, with integer dot products, cpu/quant_gemm.h). kF32 is PrepareMatrix.
  // InvalidArgument naming the format where this backend cannot keep it (the default: every
  // format but kF32); never converted silently.
  virtual absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareStoredMatrix(
      const StoredMatrix& w);
  // Whether PrepareStoredMatrix keeps `format` (the default: kF32 only).
  virtual bool KeepsWeightFormat(WeightFormat format) const { return format == WeightFormat::kF32; }
  // out[i, :] = table row ids[i] (dequantized) * scale, for a table prepared by
  // PrepareStoredMatrix in a format other than kF32 (embeddings kept in their stored form).
  // The default: InvalidArgument.
  virtual absl::Status EmbedFromMatrix(const PreparedMatrix& table, const int32_t* ids, int n,
                                       float scale, float* out);
  // Uploads a host vector (norm weights, biases, embeddings) to backend memory; on cpu may
  // return the same pointer. The returned memory lives as long as the backend.
  virtual const float* UploadVector(const float* host, int64_t count) = 0;

  // y[m, w.rows] = x[m, w.cols] * w^T (+ bias[w.rows] if bias != nullptr).
  virtual void MatMul(const float* x, int m, const PreparedMatrix& w, const float* bias,
                      float* y) = 0;
  // Several products of the same x (q, k and v; gate and up), each bitwise what MatMul gives
  // for it alone. The cpu backend runs matrices of one kind and the same cols in one parallel
  // pass (one fork and join, the activations quantized once); the default calls MatMul for each.
  virtual void MatMuls(const float* x, int m, absl::Span<const MatMulProduct> products);
  // Synthetic weights for benchmarks, generated where the backend keeps its weights (device
  // memory on cuda, so an 8B-parameter model needs no host copy): uniform in [-scale, scale]
  // from a counter hash of (seed, index). The default generates on the host (FillUniformHost)
  // and calls PrepareMatrix.
  virtual absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareRandomMatrix(int rows, int cols,
                                                                               uint64_t seed,
                                                                               float scale);
  // Fills activation memory with the same values as FillUniformHost(seed, scale).
  virtual void FillRandom(float* p, int64_t count, uint64_t seed, float scale);

  // y = x / rms(x) * weight, per row of `dim`; y may alias x.
  virtual void RmsNorm(const float* x, const float* weight, int rows, int dim, float eps,
                       float* y) = 0;
  // x += residual, then y = RmsNorm(x) (one pass on cuda). The default calls Add then RmsNorm,
  // so the cpu backend's results are unchanged.
  virtual void AddRmsNorm(float* x, const float* residual, const float* weight, int rows, int dim,
                          float eps, float* y) {
    Add(x, residual, static_cast<int64_t>(rows) * dim);
    RmsNorm(x, weight, rows, dim, eps, y);
  }
  // y += x, elementwise.
  virtual void Add(float* y, const float* x, int64_t n) = 0;
  // In-place rotary embedding of x [rows, num_heads * head_dim]; positions[rows].
  virtual void Rope(float* x, int rows, int num_heads, int head_dim, const int32_t* positions,
                    const RopeParams& rope) = 0;
  // out = silu(gate) * up, elementwise over n; out may alias gate or up.
  virtual void SwiGlu(const float* gate, const float* up, int64_t n, float* out) = 0;
  // out = gelu_tanh(gate) * up (GeGLU, PyTorch's gelu(approximate="tanh")), elementwise over n;
  // out may alias gate or up.
  virtual void GeluTanhGlu(const float* gate, const float* up, int64_t n, float* out) = 0;
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

  // Samples one token per row of logits [rows, vocab] (activation memory) as sampling.h
  // defines it, row r with params[r]; only the per-row results reach the host (on cuda the
  // logits stay on the device). InvalidArgument for bad parameters (ValidateRowSampling).
  virtual absl::StatusOr<std::vector<SampledToken>> SampleRows(
      const float* logits, int rows, int vocab, absl::Span<const RowSampling> params) = 0;

  // Structured output: sets to -inf, in place, every logit of masks[i].row that its bitmask
  // does not allow (sampling.h RowMask; the masks are host memory, the logits [rows, vocab]
  // activation memory), before SampleRows. InvalidArgument for bad masks (ValidateRowMasks).
  virtual absl::Status MaskLogits(float* logits, int rows, int vocab,
                                  absl::Span<const RowMask> masks) = 0;
};

// Creates the backend of `device`: cpu (always available), cuda (when the CUDA backend is linked
// into this binary and a device is usable), or, for std::nullopt ("auto"), cuda when both hold,
// else cpu (logging which it picked and why; backend_registry.h ResolveDevice).
absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateBackend(std::optional<Device> device,
                                                              const BackendOptions& options);

// out[i] = uniform in [-scale, scale] from a hash of (seed, i); bit-identical to the CUDA
// backend's generator (integer hash, one float multiply-add), so a synthetic model is the same
// model on every backend.
void FillUniformHost(float* out, int64_t count, uint64_t seed, float scale);

}  // namespace duet::compute
