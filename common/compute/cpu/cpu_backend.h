// CpuBackend: the always-built ComputeBackend on host memory, multi-threaded with
// duet::ThreadPool. GEMM is selected by BackendOptions::cpu_gemm:
//   "invariant" (default): own packed AVX2/FMA kernel, bitwise batch- and thread-invariant;
//   "bf16": the invariant GEMM, with bf16 weights multiplied on bf16 dot products (vdpbf16ps
//           where the CPU has AVX512_BF16, its two fmas elsewhere) after rounding each
//           activation row to bf16 (gemm.h kBf16Pairs): twice the products per instruction,
//           x's low 16 bits lost; also batch- and thread-invariant, every path the same bits;
//   "openblas": cblas_sgemm, for comparison only — NOT batch-invariant (a row's bits change
//               with M and with its position), so it must not be used where docs/design.md
//               invariant 1 (token-exactness) matters.
// Weights in GGUF block formats (Q8_0, Q4_0, Q4_1) are kept as such (PrepareStoredMatrix) and
// multiplied with integer dot products (quant_gemm.h), also bitwise batch- and thread-invariant.
// BackendOptions::cpu_isa picks the kernel path once (cpu_isa.h; refused, naming the missing
// feature, when the CPU lacks it).
// All other kernels are batch-invariant. Calls are serialised by an internal mutex (the
// thread pool is not reentrant); use one backend per calling thread for concurrency.
//
//   DUET_ASSIGN_OR_RETURN(auto backend, CpuBackend::Create({.num_threads = 2}));
//   DUET_ASSIGN_OR_RETURN(auto w, backend->PrepareMatrix(w_host, rows, cols));
//   backend->MatMul(x, m, *w, /*bias=*/nullptr, y);
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/thread_pool.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cpu/cpu_isa.h"
#include "common/compute/cpu/quant_gemm.h"

namespace duet::compute::cpu {
struct OpenBlas;
}  // namespace duet::compute::cpu

namespace duet::compute {

class CpuBackend : public ComputeBackend {
 public:
  // InvalidArgumentError for cpu_gemm openblas in a build without OpenBLAS, a cpu_isa this CPU
  // lacks, or a negative num_threads.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const BackendOptions& options);
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  int num_threads() const { return pool_.num_threads(); }
  CpuGemm gemm_kind() const { return gemm_kind_; }
  cpu::CpuIsa isa() const { return isa_; }

  float* AllocateActivations(int64_t count) override;
  void FreeActivations(float* p) override;
  void CopyToDevice(float* dst, const float* src, int64_t count) override;
  void CopyToHost(float* dst, const float* src, int64_t count) override;

  absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareMatrix(const float* w, int rows,
                                                                int cols) override;
  // GGUF blocks kept as stored, F16 / BF16 in 16 bits (BF16 in words of two k for the bf16 GEMM)
  // with the invariant and bf16 GEMMs; openblas takes f32 only.
  absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareStoredMatrix(
      const StoredMatrix& w) override;
  bool KeepsWeightFormat(WeightFormat format) const override;
  absl::Status EmbedFromMatrix(const PreparedMatrix& table, const int32_t* ids, int n, float scale,
                               float* out) override;
  // Returns `host` itself: the caller keeps the host vector alive as long as the backend.
  const float* UploadVector(const float* host, int64_t count) override;

  void MatMul(const float* x, int m, const PreparedMatrix& w, const float* bias, float* y) override;
  void MatMuls(const float* x, int m, absl::Span<const MatMulProduct> products) override;
  void RmsNorm(const float* x, const float* weight, int rows, int dim, float eps,
               float* y) override;
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
  // SampleRowOnHost per row, rows spread over the pool (each row alone: thread-invariant).
  absl::StatusOr<std::vector<SampledToken>> SampleRows(
      const float* logits, int rows, int vocab, absl::Span<const RowSampling> params) override;
  absl::Status MaskLogits(float* logits, int rows, int vocab,
                          absl::Span<const RowMask> masks) override;

 private:
  CpuBackend(int num_threads, CpuGemm gemm_kind, cpu::CpuIsa isa);

  // The angles of a recent Rope call (positions and frequencies), reused by the next calls with
  // the same ones: a forward pass's q and k of every layer sharing a RoPE compute them once.
  struct RopeAnglesMemo {
    std::vector<float> inv_freq;
    std::vector<int32_t> positions;
    std::vector<float> cos, sin;
  };
  static constexpr int kRopeMemos = 4;  // Gemma 3 alternates two RoPEs; room for both and more

  CpuGemm gemm_kind_;
  const cpu::OpenBlas* blas_ = nullptr;  // loaded for kOpenBlas (cpu/openblas.h)
  cpu::CpuIsa isa_;
  cpu::QuantScratch quant_scratch_;        // guarded by mu_
  std::vector<uint32_t> bf16_words_;       // guarded by mu_: x as bf16 words (cpu_gemm bf16)
  RopeAnglesMemo rope_memos_[kRopeMemos];  // guarded by mu_
  int rope_next_ = 0;                      // guarded by mu_: the memo replaced next
  std::mutex mu_;  // serialises kernels: ThreadPool::ParallelFor is not reentrant
  ThreadPool pool_;
};

}  // namespace duet::compute
