#include "common/compute/cpu/cpu_backend.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/compute/cpu/aligned.h"
#include "common/compute/cpu/attention.h"
#include "common/compute/cpu/elementwise.h"
#include "common/compute/cpu/gemm.h"
#include "common/compute/cpu/openblas.h"
#include "common/compute/cpu/product_items.h"

namespace duet::compute {
namespace {

using CpuIsaLevel = int;

// The invariant GEMM's packed panels (float32, bf16 or f16 elements).
class PackedMatrix : public PreparedMatrix {
 public:
  explicit PackedMatrix(cpu::PackedWeights packed) : packed_(std::move(packed)) {}
  int rows() const override { return packed_.n; }
  int cols() const override { return packed_.k; }
  int64_t bytes() const override { return packed_.bytes(); }
  const cpu::PackedWeights& packed() const { return packed_; }

 private:
  cpu::PackedWeights packed_;
};

// Weights kept in a GGUF block format.
class QuantMatrix : public PreparedMatrix {
 public:
  explicit QuantMatrix(cpu::QuantWeights w) : w_(std::move(w)) {}
  int rows() const override { return w_.n; }
  int cols() const override { return w_.k; }
  int64_t bytes() const override { return w_.bytes(); }
  const cpu::QuantWeights& weights() const { return w_; }

 private:
  cpu::QuantWeights w_;
};

// A row-major copy of the weight for cblas_sgemm.
class BlasMatrix : public PreparedMatrix {
 public:
  BlasMatrix(int rows, int cols, cpu::AlignedFloats data)
      : rows_(rows), cols_(cols), data_(std::move(data)) {}
  int rows() const override { return rows_; }
  int cols() const override { return cols_; }
  const float* data() const { return data_.get(); }

 private:
  int rows_;
  int cols_;
  cpu::AlignedFloats data_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const BackendOptions& options) {
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_threads must be >= 0 (0: all hardware threads), got ", options.num_threads));
  }
  const CpuGemm kind = options.cpu_gemm;
#if !defined(DUET_HAVE_OPENBLAS)
  if (kind == CpuGemm::kOpenBlas) {
    return absl::InvalidArgumentError(
        "cpu_gemm 'openblas': this build has no OpenBLAS (use 'invariant' or 'bf16')");
  }
#endif
  DUET_ASSIGN_OR_RETURN(cpu::CpuIsa isa, cpu::ResolveCpuIsa(options.cpu_isa));
  {
    // Once per process and path (tests create many backends).
    static std::mutex log_mu;
    static std::set<CpuIsaLevel> logged;
    std::lock_guard<std::mutex> lock(log_mu);
    if (logged.insert(static_cast<CpuIsaLevel>(isa)).second) {
      DUET_LOG(INFO) << "cpu backend: " << cpu::CpuIsaName(isa) << " kernels (cpu_isa '"
                     << (options.cpu_isa ? cpu::CpuIsaName(*options.cpu_isa) : "auto") << "')";
    }
  }
  auto backend = std::unique_ptr<CpuBackend>(new CpuBackend(options.num_threads, kind, isa));
#if defined(DUET_HAVE_OPENBLAS)
  if (kind == CpuGemm::kOpenBlas) {
    DUET_ASSIGN_OR_RETURN(backend->blas_, cpu::LoadOpenBlas());
    backend->blas_->set_num_threads(backend->num_threads());
  }
#endif
  return backend;
}

CpuBackend::CpuBackend(int num_threads, CpuGemm gemm_kind, cpu::CpuIsa isa)
    : gemm_kind_(gemm_kind), isa_(isa), pool_(num_threads) {}

CpuBackend::~CpuBackend() = default;

float* CpuBackend::AllocateActivations(int64_t count) { return cpu::AllocateAlignedRaw(count); }

void CpuBackend::FreeActivations(float* p) { std::free(p); }

void CpuBackend::CopyToDevice(float* dst, const float* src, int64_t count) {
  if (count > 0) std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
}

void CpuBackend::CopyToHost(float* dst, const float* src, int64_t count) {
  if (count > 0) std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
}

absl::StatusOr<std::unique_ptr<PreparedMatrix>> CpuBackend::PrepareMatrix(const float* w, int rows,
                                                                          int cols) {
  if (w == nullptr || rows <= 0 || cols <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("PrepareMatrix: bad matrix ", rows, "x", cols,
                                                   w == nullptr ? " (null data)" : ""));
  }
  if (gemm_kind_ == CpuGemm::kOpenBlas) {
    const int64_t count = static_cast<int64_t>(rows) * cols;
    cpu::AlignedFloats copy = cpu::AllocateAlignedFloats(count);
    if (copy == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("PrepareMatrix: out of memory for ", rows, "x", cols));
    }
    std::memcpy(copy.get(), w, static_cast<size_t>(count) * sizeof(float));
    return std::unique_ptr<PreparedMatrix>(new BlasMatrix(rows, cols, std::move(copy)));
  }
  cpu::PackedWeights packed = cpu::PackWeights(w, rows, cols);
  if (!packed.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("PrepareMatrix: out of memory for ", rows, "x", cols));
  }
  return std::unique_ptr<PreparedMatrix>(new PackedMatrix(std::move(packed)));
}

bool CpuBackend::KeepsWeightFormat(WeightFormat format) const {
  switch (format) {
    case WeightFormat::kF32:
      return true;
    case WeightFormat::kQ8_0:
    case WeightFormat::kQ4_0:
    case WeightFormat::kQ4_1:
    case WeightFormat::kQ5_0:
    case WeightFormat::kQ5_1:
    case WeightFormat::kQ4_K:
    case WeightFormat::kQ5_K:
    case WeightFormat::kQ6_K:
    case WeightFormat::kQ2_K:
    case WeightFormat::kQ3_K:
    case WeightFormat::kBf16:
    case WeightFormat::kF16:
      return gemm_kind_ != CpuGemm::kOpenBlas;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<PreparedMatrix>> CpuBackend::PrepareStoredMatrix(
    const StoredMatrix& w) {
  if (w.format == WeightFormat::kF32) {
    return PrepareMatrix(static_cast<const float*>(w.data), w.rows, w.cols);
  }
  if (!KeepsWeightFormat(w.format)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cpu backend cannot keep ", WeightFormatName(w.format), " weights",
                     gemm_kind_ == CpuGemm::kOpenBlas ? " with cpu_gemm 'openblas' (f32 only)" : "",
                     " (use --weights_dtype=f32)"));
  }
  if (w.format == WeightFormat::kBf16 || w.format == WeightFormat::kF16) {
    if (w.data == nullptr || w.rows <= 0 || w.cols <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("PrepareStoredMatrix: bad ",
                                                     WeightFormatName(w.format), " matrix ", w.rows,
                                                     "x", w.cols));
    }
    const auto* bits = static_cast<const uint16_t*>(w.data);
    cpu::PackedWeights packed =
        w.format == WeightFormat::kF16
            ? cpu::PackWeights16(bits, w.rows, w.cols, cpu::PanelType::kF16)
        : gemm_kind_ == CpuGemm::kBf16
            ? cpu::PackWeightsBf16Pairs(bits, w.rows, w.cols)
            : cpu::PackWeights16(bits, w.rows, w.cols, cpu::PanelType::kBf16);
    if (!packed.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("PrepareStoredMatrix: out of memory for ", w.rows, "x", w.cols));
    }
    return std::unique_ptr<PreparedMatrix>(new PackedMatrix(std::move(packed)));
  }
  cpu::QuantFormat f = cpu::QuantFormat::kQ8_0;
  if (w.format == WeightFormat::kQ4_0) f = cpu::QuantFormat::kQ4_0;
  if (w.format == WeightFormat::kQ4_1) f = cpu::QuantFormat::kQ4_1;
  if (w.format == WeightFormat::kQ5_0) f = cpu::QuantFormat::kQ5_0;
  if (w.format == WeightFormat::kQ5_1) f = cpu::QuantFormat::kQ5_1;
  if (w.format == WeightFormat::kQ4_K) f = cpu::QuantFormat::kQ4_K;
  if (w.format == WeightFormat::kQ5_K) f = cpu::QuantFormat::kQ5_K;
  if (w.format == WeightFormat::kQ6_K) f = cpu::QuantFormat::kQ6_K;
  if (w.format == WeightFormat::kQ2_K) f = cpu::QuantFormat::kQ2_K;
  if (w.format == WeightFormat::kQ3_K) f = cpu::QuantFormat::kQ3_K;
  std::lock_guard<std::mutex> lock(mu_);  // the pool runs one parallel pass at a time
  DUET_ASSIGN_OR_RETURN(
      cpu::QuantWeights packed,
      cpu::PackQuantWeights(f, static_cast<const uint8_t*>(w.data), w.rows, w.cols, &pool_));
  return std::unique_ptr<PreparedMatrix>(new QuantMatrix(std::move(packed)));
}

absl::Status CpuBackend::EmbedFromMatrix(const PreparedMatrix& table, const int32_t* ids, int n,
                                         float scale, float* out) {
  // Rows [n] of a table of `rows` x `k` into out, each through row(id, dst), then scaled.
  auto lookup = [&](int rows, int k, const auto& row) -> absl::Status {
    for (int i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= rows) {
        return absl::InvalidArgumentError(
            absl::StrCat("EmbedFromMatrix: id ", ids[i], " outside [0, ", rows, ")"));
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    pool_.ParallelFor(n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float* dst = out + i * k;
        row(ids[i], dst);
        if (scale != 1.f) {
          for (int j = 0; j < k; ++j) dst[j] *= scale;
        }
      }
    });
    return absl::OkStatus();
  };
  if (const auto* pm = dynamic_cast<const PackedMatrix*>(&table)) {
    const cpu::PackedWeights& w = pm->packed();
    return lookup(w.n, w.k, [&](int id, float* dst) { cpu::UnpackRow(w, id, dst); });
  }
  if (const auto* qm = dynamic_cast<const QuantMatrix*>(&table)) {
    const cpu::QuantWeights& w = qm->weights();
    return lookup(w.n, w.k, [&](int id, float* dst) { cpu::DequantizeQuantRow(w, id, dst); });
  }
  return absl::InvalidArgumentError(
      "EmbedFromMatrix: the table is not kept in a block or 16-bit format");
}

const float* CpuBackend::UploadVector(const float* host, int64_t count) { return host; }

void CpuBackend::MatMul(const float* x, int m, const PreparedMatrix& w, const float* bias,
                        float* y) {
  std::lock_guard<std::mutex> lock(mu_);
#if defined(DUET_HAVE_OPENBLAS)
  if (gemm_kind_ == CpuGemm::kOpenBlas) {
    const auto& bw = dynamic_cast<const BlasMatrix&>(w);
    const int n = bw.rows();
    const int k = bw.cols();
    if (m <= 0) return;
    blas_->sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.f, x, k, bw.data(), k, 0.f, y,
                 n);
    if (bias != nullptr) {
      for (int64_t i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) y[i * n + j] += bias[j];
      }
    }
    return;
  }
#endif
  if (const auto* qm = dynamic_cast<const QuantMatrix*>(&w)) {
    cpu::QuantGemm(&pool_, x, m, qm->weights(), bias, y, isa_, &quant_scratch_);
    return;
  }
  const auto& pw = dynamic_cast<const PackedMatrix&>(w);
  cpu::InvariantGemm(&pool_, x, m, pw.packed(), bias, y, isa_, &bf16_words_);
}

void CpuBackend::MatMuls(const float* x, int m, absl::Span<const MatMulProduct> products) {
  // Quantized matrices of one k, or packed ones of one k: one pass; anything else one by one.
  constexpr size_t kMax = cpu::internal::kMaxProducts;
  if (gemm_kind_ != CpuGemm::kOpenBlas && !products.empty() && products.size() <= kMax) {
    cpu::QuantProduct quant[kMax];
    cpu::GemmProduct packed[kMax];
    size_t nq = 0;
    size_t np = 0;
    const int k = products[0].w->cols();
    for (const MatMulProduct& p : products) {
      if (p.w->cols() != k) break;
      if (const auto* qm = dynamic_cast<const QuantMatrix*>(p.w)) {
        quant[nq++] = {&qm->weights(), p.bias, p.y};
      } else if (const auto* pm = dynamic_cast<const PackedMatrix*>(p.w)) {
        packed[np++] = {&pm->packed(), p.bias, p.y};
      }
    }
    const int n = static_cast<int>(products.size());
    if (nq == products.size()) {
      std::lock_guard<std::mutex> lock(mu_);
      cpu::QuantGemmMany(&pool_, x, m, quant, n, isa_, &quant_scratch_);
      return;
    }
    if (np == products.size()) {
      std::lock_guard<std::mutex> lock(mu_);
      cpu::InvariantGemmMany(&pool_, x, m, packed, n, isa_, &bf16_words_);
      return;
    }
  }
  ComputeBackend::MatMuls(x, m, products);
}

void CpuBackend::RmsNorm(const float* x, const float* weight, int rows, int dim, float eps,
                         float* y) {
  std::lock_guard<std::mutex> lock(mu_);
  cpu::RmsNormRows(&pool_, x, weight, rows, dim, eps, y);
}

void CpuBackend::Add(float* y, const float* x, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  cpu::AddInPlace(&pool_, y, x, n);
}

void CpuBackend::Rope(float* x, int rows, int num_heads, int head_dim, const int32_t* positions,
                      const RopeParams& rope) {
  std::lock_guard<std::mutex> lock(mu_);
  const int half = head_dim / 2;
  DUET_CHECK(head_dim % 2 == 0 && static_cast<int>(rope.inv_freq.size()) == half)
      << "RoPE inv_freq has " << rope.inv_freq.size() << " entries for head_dim " << head_dim;
  RopeAnglesMemo* memo = nullptr;
  for (RopeAnglesMemo& m : rope_memos_) {
    if (m.inv_freq == rope.inv_freq && static_cast<int>(m.positions.size()) == rows &&
        std::equal(positions, positions + rows, m.positions.begin())) {
      memo = &m;
      break;
    }
  }
  if (memo == nullptr) {
    memo = &rope_memos_[rope_next_];
    rope_next_ = (rope_next_ + 1) % kRopeMemos;
    memo->inv_freq = rope.inv_freq;
    memo->positions.assign(positions, positions + rows);
    memo->cos.resize(static_cast<size_t>(rows) * half);
    memo->sin.resize(memo->cos.size());
    cpu::RopeAngles(&pool_, positions, rows, rope.inv_freq.data(), half, memo->cos.data(),
                    memo->sin.data());
  }
  cpu::RopeRotate(&pool_, x, rows, num_heads, head_dim, memo->cos.data(), memo->sin.data());
}

void CpuBackend::SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  std::lock_guard<std::mutex> lock(mu_);
  cpu::SwiGluElems(&pool_, gate, up, n, out);
}

void CpuBackend::GeluTanhGlu(const float* gate, const float* up, int64_t n, float* out) {
  std::lock_guard<std::mutex> lock(mu_);
  cpu::GeluTanhGluElems(&pool_, gate, up, n, out);
}

void CpuBackend::Embed(const float* table, int dim, const int32_t* ids, int n, float* out) {
  std::lock_guard<std::mutex> lock(mu_);
  cpu::EmbedRows(&pool_, table, dim, ids, n, out);
}

void CpuBackend::WriteKv(const kv::KvCacheView& cache, int layer, const float* k, const float* v,
                         const int64_t* slots, int n) {
  cpu::WriteKvRows(cache, layer, k, v, slots, n);
}

void CpuBackend::PagedAttention(const kv::KvCacheView& cache, int layer, const float* q,
                                absl::Span<const AttentionSeq> seqs, const AttentionParams& params,
                                float* out) {
  std::lock_guard<std::mutex> lock(mu_);
  cpu::PagedAttention(&pool_, cache, layer, q, seqs, params, out, isa_);
}

absl::StatusOr<std::vector<SampledToken>> CpuBackend::SampleRows(
    const float* logits, int rows, int vocab, absl::Span<const RowSampling> params) {
  DUET_RETURN_IF_ERROR(ValidateRowSampling(rows, vocab, params));
  std::vector<SampledToken> out(rows);
  std::lock_guard<std::mutex> lock(mu_);
  pool_.ParallelFor(rows, /*grain=*/1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      out[r] = SampleRowOnHost(logits + r * vocab, vocab, params[r]);
    }
  });
  return out;
}

absl::Status CpuBackend::MaskLogits(float* logits, int rows, int vocab,
                                    absl::Span<const RowMask> masks) {
  DUET_RETURN_IF_ERROR(ValidateRowMasks(rows, vocab, masks));
  for (const RowMask& m : masks) {
    MaskRowOnHost(logits + static_cast<int64_t>(m.row) * vocab, vocab, m.allowed_words);
  }
  return absl::OkStatus();
}

}  // namespace duet::compute
