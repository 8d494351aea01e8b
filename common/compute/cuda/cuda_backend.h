// CudaBackend: ComputeBackend on one NVIDIA GPU. Activations, weights and the KV pool live in
// device memory (cudaMalloc; never managed memory); all kernels run in order on one
// non-blocking stream, so a call returns once its work is queued. GEMMs go through cuBLAS
// (cublasGemmEx) with fp32 accumulation and fp32 outputs; weights are stored in the GEMM dtype
// (BackendOptions::cuda_gemm_dtype: "bf16" (default), "f16" or "f32"), and for bf16/f16 the
// activations are converted to that dtype right before each GEMM. Index arrays (ids, positions,
// slots, block tables) arrive as host memory; each is uploaded once per distinct content
// (layers of one forward pass reuse the copy). KV caches may be f32, f16, bf16, int8 or fp8 (e4m3;
// quantized per (token, kv head) as the CPU backend does).
//
// Kernels return void: the first failure (launch error, bad argument, device fault) is kept in
// status() and logged once; ModelRunner::Forward returns it.
//
// Batch invariance: attention and the elementwise kernels compute each row alone, but cuBLAS
// chooses its GEMM algorithm from the shape, so a row's low bits can change with the batch size.
// Disaggregated and colocated runs on CUDA agree token for token only where no such change flips
// a greedy choice; the parity tests compare against the CPU with tolerances.
//
//   DUET_ASSIGN_OR_RETURN(auto backend, CudaBackend::Create({.cuda_gemm_dtype = "bf16"}));
//   DUET_ASSIGN_OR_RETURN(auto pool_mem, backend->AllocateKvMemory(layout.RegionBytes(n)));
//   DUET_ASSIGN_OR_RETURN(auto pool, kv::BlockPool::CreateOver(layout, n, pool_mem->data(), ...));
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cuda/cuda_resources.h"
#include "common/compute/cuda/kernels.h"

namespace duet::compute::cuda {

class CudaBackend : public ComputeBackend {
 public:
  // InvalidArgument for a bad dtype or device ordinal; the CUDA/cuBLAS error otherwise.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const BackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  ElemType gemm_dtype() const { return gemm_dtype_; }
  bool tensor_prefill() const { return tensor_prefill_; }
  int device() const { return device_; }
  const std::string& device_name() const { return device_name_; }
  cudaStream_t stream() const { return stream_.get(); }

  // Device memory for a KV pool (BlockPool::CreateOver), owned by the caller, zeroed.
  absl::StatusOr<DeviceBuffer> AllocateKvRegion(size_t bytes);
  // KV memory (compute_backend.h): the pool in device memory (AllocateKvRegion), host mirrors
  // page-locked (cudaMallocHost / cudaHostRegister), staging on the copy stream.
  absl::StatusOr<std::unique_ptr<KvMemory>> AllocateKvMemory(size_t bytes) override;
  bool kv_memory_is_host() const override { return false; }
  absl::Status CheckKvDtype(kv::KvDtype dtype) const override;
  kv::KvDtype NativeKvDtype() const override;
  absl::StatusOr<std::unique_ptr<KvMemory>> AllocateHostMirror(size_t bytes) override;
  absl::StatusOr<std::unique_ptr<HostPinning>> PinHostMemory(void* p, size_t bytes) override;
  absl::StatusOr<std::shared_ptr<WorkMarker>> CopyKvToHost(const kv::KvCacheView& pool, int layer,
                                                           absl::Span<const kv::BlockId> blocks,
                                                           const kv::KvCacheView& mirror,
                                                           const WorkMarker* after) override;
  absl::StatusOr<std::shared_ptr<WorkMarker>> CopyKvFromHost(const kv::KvCacheView& mirror,
                                                             int layer,
                                                             absl::Span<const kv::BlockId> blocks,
                                                             const kv::KvCacheView& pool,
                                                             const WorkMarker* after) override;

  float* AllocateActivations(int64_t count) override;
  void FreeActivations(float* p) override;
  void CopyToDevice(float* dst, const float* src, int64_t count) override;
  void CopyToHost(float* dst, const float* src, int64_t count) override;
  void CopyWithin(float* dst, const float* src, int64_t count) override;
  void Synchronize() override;
  absl::Status status() const override;

  absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareMatrix(const float* w, int rows,
                                                               int cols) override;
  const float* UploadVector(const float* host, int64_t count) override;
  absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareRandomMatrix(int rows, int cols,
                                                                     uint64_t seed,
                                                                     float scale) override;
  void FillRandom(float* p, int64_t count, uint64_t seed, float scale) override;

  void MatMul(const float* x, int m, const PreparedMatrix& w, const float* bias,
              float* y) override;
  void RmsNorm(const float* x, const float* weight, int rows, int dim, float eps,
               float* y) override;
  void AddRmsNorm(float* x, const float* residual, const float* weight, int rows, int dim,
                  float eps, float* y) override;
  void Add(float* y, const float* x, int64_t n) override;
  void Rope(float* x, int rows, int num_heads, int head_dim, const int32_t* positions,
            const RopeParams& rope) override;
  void SwiGlu(const float* gate, const float* up, int64_t n, float* out) override;
  void GeluTanhGlu(const float* gate, const float* up, int64_t n, float* out) override;
  void Embed(const float* table, int dim, const int32_t* ids, int n, float* out) override;
  void WriteKv(const kv::KvCacheView& cache, int layer, const float* k, const float* v,
               const int64_t* slots, int n) override;
  void PagedAttention(const kv::KvCacheView& cache, int layer, const float* q,
                      absl::Span<const AttentionSeq> seqs, const AttentionParams& params,
                      float* out) override;

  // An event recorded on the compute stream (per layer from ModelRunner's async hook).
  std::shared_ptr<WorkMarker> MarkQueuedWork() override;

  // Sampling on the device (sampling_kernels.cu): argmax for greedy rows, a CUB segmented sort
  // of the other rows' candidates then a prefix-sum walk; only the per-row results (a few
  // hundred bytes a row) are copied back. Synchronises the compute stream.
  absl::StatusOr<std::vector<SampledToken>> SampleRows(
      const float* logits, int rows, int vocab, absl::Span<const RowSampling> params) override;
  absl::Status MaskLogits(float* logits, int rows, int vocab,
                          absl::Span<const RowMask> masks) override;

  // Greedy sampling on the device: out[r] = argmax of logits row r (device memory), copied to
  // the host.
  absl::StatusOr<std::vector<int32_t>> ArgMax(const float* logits, int rows, int vocab);

 private:
  // A host array uploaded to a private device buffer; re-uploaded only when its content changes.
  struct UploadSlot {
    std::vector<uint8_t> shadow;
    DeviceBuffer device;
  };
  enum SlotKind {
    kIds = 0,
    kPositions,
    kSlots,
    kAttention,
    kInvFreq,
    kSampling,
    kTokenMasks,
    kNumSlots
  };

  CudaBackend(int device, ElemType gemm_dtype, bool tensor_prefill);
  absl::Status Init();
  // Locks mu_ and makes device_ current on the calling thread.
  std::unique_lock<std::mutex> Enter();
  // Device copy of `bytes` host bytes in `slot` (nullptr and status() set on failure).
  const void* Upload(SlotKind slot, const void* host, size_t bytes);
  // Grows `buf` to at least `bytes` (synchronising before freeing the old one).
  bool Reserve(DeviceBuffer* buf, size_t bytes);
  void Record(const absl::Status& st);
  void CheckLaunch(const char* what);
  bool Failed() const;
  // CopyKvToHost / CopyKvFromHost: `layer` of `blocks` from `from` to `to` on the copy stream,
  // behind `after`; `kind` is the cudaMemcpyKind.
  absl::StatusOr<std::shared_ptr<WorkMarker>> CopyKvAsync(const kv::KvCacheView& from,
                                                          const kv::KvCacheView& to, int layer,
                                                          absl::Span<const kv::BlockId> blocks,
                                                          const WorkMarker* after,
                                                          cudaMemcpyKind kind, const char* what);

  const int device_;
  const ElemType gemm_dtype_;
  const bool tensor_prefill_;
  std::string device_name_;
  Stream stream_;
  Stream copy_stream_;  // KV staging copies, ordered behind compute-stream events
  CublasHandle cublas_;
  DeviceBuffer cublas_workspace_;
  DeviceBuffer gemm_input_;  // x converted to the GEMM dtype
  DeviceBuffer attn_partials_;
  DeviceBuffer argmax_out_;
  // SampleRows scratch: the sorted rows' (logit, id) pairs, twice (the sort ping-pongs), CUB's
  // temporary storage, the per-row results and the processed rows.
  DeviceBuffer sort_keys_[2];
  DeviceBuffer sort_ids_[2];
  DeviceBuffer sort_temp_;
  DeviceBuffer sample_results_;
  DeviceBuffer processed_logits_;  // processed rows (sampling/sampling.h), [processed, vocab]
  UploadSlot slots_[kNumSlots];
  std::vector<DeviceBuffer> vectors_;  // UploadVector results, alive as long as the backend

  std::mutex mu_;  // serialises calls (one stream, shared scratch buffers)
  mutable std::mutex err_mu_;
  absl::Status first_error_;  // guarded by err_mu_
};

// Registers "cuda" with the backend registry (done by cuda_registration.cc in binaries that
// link duet_cuda_backend); returns true.
bool RegisterCudaBackend();

}  // namespace duet::compute::cuda
