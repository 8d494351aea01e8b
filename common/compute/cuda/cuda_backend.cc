#include "common/compute/cuda/cuda_backend.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/compute/backend_registry.h"
#include "common/compute/cuda/cuda_check.h"

namespace duet::compute::cuda {
namespace {

constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
static_assert(kDevMaxTopLogprobs == kMaxTopLogprobs);

size_t ElemBytes(ElemType t) { return t == ElemType::kF32 ? 4 : 2; }

cudaDataType_t CudaType(ElemType t) {
  switch (t) {
    case ElemType::kF16: return CUDA_R_16F;
    case ElemType::kBF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

ElemType GemmElemType(CudaGemmDtype d) {
  switch (d) {
    case CudaGemmDtype::kBf16:
      return ElemType::kBF16;
    case CudaGemmDtype::kF16:
      return ElemType::kF16;
    case CudaGemmDtype::kF32:
      return ElemType::kF32;
  }
  return ElemType::kBF16;
}

// Every kv::KvDtype has a kernel type (CheckKvDtype accepts them all).
KvElemType ToKvElemType(kv::KvDtype d) {
  switch (d) {
    case kv::KvDtype::kF32:
      return KvElemType::kF32;
    case kv::KvDtype::kF16:
      return KvElemType::kF16;
    case kv::KvDtype::kBF16:
      return KvElemType::kBF16;
    case kv::KvDtype::kInt8:
      return KvElemType::kInt8;
    case kv::KvDtype::kFp8E4M3:
      return KvElemType::kFp8E4M3;
  }
  DUET_CHECK(false) << "unknown KV dtype " << static_cast<int>(d);
  return KvElemType::kF32;
}

KvCacheArgs CacheArgs(const kv::KvCacheView& cache, int layer) {
  KvCacheArgs a;
  a.base = cache.base;
  a.dtype = ToKvElemType(cache.layout.dtype);
  a.num_blocks = cache.num_blocks;
  a.layer = layer;
  a.block_size = cache.layout.block_size;
  a.num_kv_heads = cache.layout.num_kv_heads;
  a.head_dim = cache.layout.head_dim;
  return a;
}

// A weight matrix [rows, cols] in device memory, in the backend's GEMM dtype.
class DeviceMatrix : public PreparedMatrix {
 public:
  DeviceMatrix(int rows, int cols, ElemType type, DeviceBuffer data)
      : rows_(rows), cols_(cols), type_(type), data_(std::move(data)) {}
  int rows() const override { return rows_; }
  int cols() const override { return cols_; }
  ElemType type() const { return type_; }
  const void* data() const { return data_.get(); }

 private:
  int rows_;
  int cols_;
  ElemType type_;
  DeviceBuffer data_;
};

// An event on one of the backend's streams.
class CudaWorkMarker : public WorkMarker {
 public:
  CudaWorkMarker(int device, Event event) : device_(device), event_(std::move(event)) {}
  cudaEvent_t event() const { return event_.get(); }
  bool Done() override {
    cudaSetDevice(device_);
    return cudaEventQuery(event_.get()) == cudaSuccess;
  }
  absl::Status Wait(absl::Time deadline) override {
    cudaSetDevice(device_);
    while (true) {
      const cudaError_t err = cudaEventQuery(event_.get());
      if (err == cudaSuccess) return absl::OkStatus();
      if (err != cudaErrorNotReady) return CudaCallStatus(err, "cudaEventQuery", __FILE__, __LINE__);
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError("CUDA work marker not reached before the deadline");
      }
      absl::SleepFor(absl::Microseconds(20));
    }
  }

 private:
  int device_;
  Event event_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const BackendOptions& options) {
  DUET_ASSIGN_OR_RETURN(int count, CudaDeviceCount());
  if (options.cuda_device < 0 || options.cuda_device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_device ", options.cuda_device,
                                                   " out of range: ", count, " device(s)"));
  }
  std::unique_ptr<CudaBackend> b(
      new CudaBackend(options.cuda_device, GemmElemType(options.cuda_gemm_dtype),
                      options.cuda_prefill_attention == CudaPrefillAttention::kTensor));
  DUET_RETURN_IF_ERROR(b->Init());
  return b;
}

absl::Status CudaBackend::CheckKvDtype(kv::KvDtype dtype) const {
  switch (dtype) {
    case kv::KvDtype::kF32:
    case kv::KvDtype::kF16:
    case kv::KvDtype::kBF16:
    case kv::KvDtype::kInt8:
    case kv::KvDtype::kFp8E4M3:
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("KV dtype ", static_cast<int>(dtype),
                   ": the cuda backend stores f32, f16, bf16, int8 or fp8 KV"));
}

kv::KvDtype CudaBackend::NativeKvDtype() const {
  return gemm_dtype_ == ElemType::kBF16  ? kv::KvDtype::kBF16
         : gemm_dtype_ == ElemType::kF16 ? kv::KvDtype::kF16
                                         : kv::KvDtype::kF32;
}

CudaBackend::CudaBackend(int device, ElemType gemm_dtype, bool tensor_prefill)
    : device_(device), gemm_dtype_(gemm_dtype), tensor_prefill_(tensor_prefill) {}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(copy_stream_.get());
  cudaStreamSynchronize(stream_.get());  // members free their memory after queued work ends
}

absl::Status CudaBackend::Init() {
  DUET_CUDA_CHECK(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  DUET_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  device_name_ = absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ", ",
                              prop.totalGlobalMem >> 20, " MiB)");
  if (prop.major < 8) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device_, " is ", device_name_,
                     ": duet's CUDA backend needs compute capability 8.0 or newer"));
  }
  DUET_ASSIGN_OR_RETURN(stream_, Stream::Create());
  DUET_ASSIGN_OR_RETURN(copy_stream_, Stream::Create());
  DUET_ASSIGN_OR_RETURN(cublas_, CublasHandle::Create());
  DUET_CUBLAS_CHECK(cublasSetStream(cublas_.get(), stream_.get()));
  // Pure fp32 for f32 GEMMs (no TF32); bf16/f16 GEMMs use tensor cores regardless.
  DUET_CUBLAS_CHECK(cublasSetMathMode(cublas_.get(), CUBLAS_DEFAULT_MATH));
  DUET_ASSIGN_OR_RETURN(cublas_workspace_, DeviceBuffer::Create(kCublasWorkspaceBytes));
  DUET_CUBLAS_CHECK(
      cublasSetWorkspace(cublas_.get(), cublas_workspace_.get(), cublas_workspace_.bytes()));
  DUET_LOG(INFO) << "cuda backend on device " << device_ << ": " << device_name_ << ", GEMM "
                 << (gemm_dtype_ == ElemType::kBF16 ? "bf16"
                     : gemm_dtype_ == ElemType::kF16 ? "f16" : "f32")
                 << ", prefill attention " << (tensor_prefill_ ? "tensor" : "simt");
  return absl::OkStatus();
}

std::unique_lock<std::mutex> CudaBackend::Enter() {
  std::unique_lock<std::mutex> lock(mu_);
  cudaSetDevice(device_);  // calls may come from any thread; cheap when already current
  return lock;
}

void CudaBackend::Record(const absl::Status& st) {
  if (st.ok()) return;
  std::lock_guard<std::mutex> lock(err_mu_);
  if (first_error_.ok()) {
    DUET_LOG(ERROR) << "cuda backend: " << st;
    first_error_ = st;
  }
}

bool CudaBackend::Failed() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return !first_error_.ok();
}

absl::Status CudaBackend::status() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return first_error_;
}

void CudaBackend::CheckLaunch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) Record(CudaCallStatus(err, what, __FILE__, __LINE__));
}

bool CudaBackend::Reserve(DeviceBuffer* buf, size_t bytes) {
  if (buf->bytes() >= bytes) return true;
  // Queued kernels may still read the old buffer.
  Record(DUET_CUDA_STATUS(cudaStreamSynchronize(stream_.get())));
  buf->reset();
  absl::StatusOr<DeviceBuffer> nb = DeviceBuffer::Create(bytes + bytes / 4);
  if (!nb.ok()) {
    Record(nb.status());
    return false;
  }
  *buf = std::move(nb).value();
  return true;
}

const void* CudaBackend::Upload(SlotKind kind, const void* host, size_t bytes) {
  UploadSlot& slot = slots_[kind];
  if (bytes == 0) bytes = 1;  // keep a valid pointer for empty arrays
  const bool same = slot.device.get() != nullptr && slot.shadow.size() == bytes &&
                    (host == nullptr || std::memcmp(slot.shadow.data(), host, bytes) == 0);
  if (same) return slot.device.get();
  if (!Reserve(&slot.device, bytes)) return nullptr;
  slot.shadow.assign(bytes, 0);
  if (host != nullptr) std::memcpy(slot.shadow.data(), host, bytes);
  // From the shadow: pageable source, so the call returns once the bytes are staged.
  const absl::Status st = DUET_CUDA_STATUS(cudaMemcpyAsync(
      slot.device.get(), slot.shadow.data(), bytes, cudaMemcpyHostToDevice, stream_.get()));
  if (!st.ok()) {
    Record(st);
    slot.shadow.clear();
    return nullptr;
  }
  return slot.device.get();
}

absl::StatusOr<DeviceBuffer> CudaBackend::AllocateKvRegion(size_t bytes) {
  auto lock = Enter();
  DUET_CUDA_CHECK(cudaSetDevice(device_));
  DUET_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::Create(bytes));
  DUET_CUDA_CHECK(cudaMemsetAsync(buf.get(), 0, bytes, stream_.get()));
  DUET_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  return buf;
}

namespace {

// KvMemory over a device buffer or a page-locked host buffer.
template <typename Buffer>
class CudaKvMemory : public KvMemory {
 public:
  CudaKvMemory(Buffer buf, size_t bytes, bool host) : buf_(std::move(buf)), bytes_(bytes),
                                                      host_(host) {}
  void* data() const override { return buf_.get(); }
  size_t bytes() const override { return bytes_; }
  bool host_addressable() const override { return host_; }

 private:
  Buffer buf_;
  size_t bytes_;
  bool host_;
};

class CudaHostPinning : public HostPinning {
 public:
  explicit CudaHostPinning(HostRegistration reg) : reg_(std::move(reg)) {}

 private:
  HostRegistration reg_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvMemory>> CudaBackend::AllocateKvMemory(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("KV memory: zero bytes requested");
  DUET_ASSIGN_OR_RETURN(DeviceBuffer buf, AllocateKvRegion(bytes));
  return std::unique_ptr<KvMemory>(new CudaKvMemory<DeviceBuffer>(std::move(buf), bytes, false));
}

absl::StatusOr<std::unique_ptr<KvMemory>> CudaBackend::AllocateHostMirror(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("host mirror: zero bytes requested");
  auto lock = Enter();
  DUET_ASSIGN_OR_RETURN(PinnedBuffer buf, PinnedBuffer::Create(bytes));
  std::memset(buf.get(), 0, bytes);
  return std::unique_ptr<KvMemory>(new CudaKvMemory<PinnedBuffer>(std::move(buf), bytes, true));
}

absl::StatusOr<std::unique_ptr<HostPinning>> CudaBackend::PinHostMemory(void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("PinHostMemory: null or empty range");
  }
  auto lock = Enter();
  DUET_ASSIGN_OR_RETURN(HostRegistration reg, HostRegistration::Create(p, bytes));
  return std::unique_ptr<HostPinning>(new CudaHostPinning(std::move(reg)));
}

float* CudaBackend::AllocateActivations(int64_t count) {
  auto lock = Enter();
  void* p = nullptr;
  const absl::Status st = DUET_CUDA_STATUS(
      cudaMalloc(&p, static_cast<size_t>(count > 0 ? count : 1) * sizeof(float)));
  if (!st.ok()) {
    Record(st);
    return nullptr;
  }
  return static_cast<float*>(p);
}

void CudaBackend::FreeActivations(float* p) {
  if (p == nullptr) return;
  auto lock = Enter();
  cudaStreamSynchronize(stream_.get());
  cudaFree(p);
}

void CudaBackend::CopyToDevice(float* dst, const float* src, int64_t count) {
  if (count <= 0) return;
  auto lock = Enter();
  Record(DUET_CUDA_STATUS(cudaMemcpyAsync(dst, src, static_cast<size_t>(count) * sizeof(float),
                                          cudaMemcpyHostToDevice, stream_.get())));
}

void CudaBackend::CopyToHost(float* dst, const float* src, int64_t count) {
  if (count <= 0) return;
  auto lock = Enter();
  Record(DUET_CUDA_STATUS(cudaMemcpyAsync(dst, src, static_cast<size_t>(count) * sizeof(float),
                                          cudaMemcpyDeviceToHost, stream_.get())));
  Record(DUET_CUDA_STATUS(cudaStreamSynchronize(stream_.get())));
}

void CudaBackend::CopyWithin(float* dst, const float* src, int64_t count) {
  if (count <= 0) return;
  auto lock = Enter();
  Record(DUET_CUDA_STATUS(cudaMemcpyAsync(dst, src, static_cast<size_t>(count) * sizeof(float),
                                          cudaMemcpyDeviceToDevice, stream_.get())));
}

void CudaBackend::Synchronize() {
  auto lock = Enter();
  Record(DUET_CUDA_STATUS(cudaStreamSynchronize(stream_.get())));
}

absl::StatusOr<std::unique_ptr<PreparedMatrix>> CudaBackend::PrepareMatrix(const float* w,
                                                                          int rows, int cols) {
  if (w == nullptr || rows <= 0 || cols <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("PrepareMatrix: bad matrix ", rows, "x", cols,
                                                   w == nullptr ? " (null data)" : ""));
  }
  auto lock = Enter();
  const int64_t n = static_cast<int64_t>(rows) * cols;
  DUET_ASSIGN_OR_RETURN(DeviceBuffer data, DeviceBuffer::Create(n * ElemBytes(gemm_dtype_)));
  if (gemm_dtype_ == ElemType::kF32) {
    DUET_CUDA_CHECK(cudaMemcpyAsync(data.get(), w, n * sizeof(float), cudaMemcpyHostToDevice,
                                    stream_.get()));
  } else {
    // Upload f32 in slices through a scratch buffer and convert on the device.
    constexpr int64_t kSlice = int64_t{1} << 24;
    DUET_ASSIGN_OR_RETURN(DeviceBuffer staging,
                          DeviceBuffer::Create(std::min(n, kSlice) * sizeof(float)));
    for (int64_t off = 0; off < n; off += kSlice) {
      const int64_t len = std::min(kSlice, n - off);
      DUET_CUDA_CHECK(cudaMemcpyAsync(staging.get(), w + off, len * sizeof(float),
                                      cudaMemcpyHostToDevice, stream_.get()));
      LaunchConvertFromF32(staging.as<float>(),
                           static_cast<uint8_t*>(data.get()) + off * ElemBytes(gemm_dtype_),
                           gemm_dtype_, len, stream_.get());
      DUET_CUDA_CHECK(cudaGetLastError());
    }
    DUET_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));  // before staging is freed
  }
  DUET_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  return std::unique_ptr<PreparedMatrix>(new DeviceMatrix(rows, cols, gemm_dtype_, std::move(data)));
}

absl::StatusOr<std::unique_ptr<PreparedMatrix>> CudaBackend::PrepareRandomMatrix(int rows, int cols,
                                                                                uint64_t seed,
                                                                                float scale) {
  if (rows <= 0 || cols <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("PrepareRandomMatrix: bad shape ", rows, "x", cols));
  }
  auto lock = Enter();
  const int64_t n = static_cast<int64_t>(rows) * cols;
  DUET_ASSIGN_OR_RETURN(DeviceBuffer data, DeviceBuffer::Create(n * ElemBytes(gemm_dtype_)));
  LaunchFillUniform(data.get(), gemm_dtype_, n, seed, scale, stream_.get());
  DUET_CUDA_CHECK(cudaGetLastError());
  return std::unique_ptr<PreparedMatrix>(new DeviceMatrix(rows, cols, gemm_dtype_, std::move(data)));
}

void CudaBackend::FillRandom(float* p, int64_t count, uint64_t seed, float scale) {
  auto lock = Enter();
  LaunchFillUniform(p, ElemType::kF32, count, seed, scale, stream_.get());
  CheckLaunch("FillUniform");
}

const float* CudaBackend::UploadVector(const float* host, int64_t count) {
  auto lock = Enter();
  absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Create(static_cast<size_t>(count) * sizeof(float));
  if (!buf.ok()) {
    Record(buf.status());
    return nullptr;
  }
  Record(DUET_CUDA_STATUS(cudaMemcpyAsync(buf->get(), host, count * sizeof(float),
                                          cudaMemcpyHostToDevice, stream_.get())));
  Record(DUET_CUDA_STATUS(cudaStreamSynchronize(stream_.get())));
  vectors_.push_back(std::move(buf).value());
  return vectors_.back().as<float>();
}

void CudaBackend::MatMul(const float* x, int m, const PreparedMatrix& w, const float* bias,
                         float* y) {
  if (m <= 0) return;
  auto lock = Enter();
  const auto* dm = dynamic_cast<const DeviceMatrix*>(&w);
  if (dm == nullptr) {
    Record(absl::InvalidArgumentError("MatMul: matrix was not prepared by the cuda backend"));
    return;
  }
  const int n = dm->rows(), k = dm->cols();
  const void* a_in = x;
  if (dm->type() != ElemType::kF32) {
    const int64_t elems = static_cast<int64_t>(m) * k;
    if (!Reserve(&gemm_input_, elems * ElemBytes(dm->type()))) return;
    LaunchConvertFromF32(x, gemm_input_.get(), dm->type(), elems, stream_.get());
    CheckLaunch("ConvertFromF32");
    a_in = gemm_input_.get();
  }
  // Row-major y[m, n] = x[m, k] * W[n, k]^T is column-major y^T[n, m] = W^T... : with W
  // seen column-major as [k, n] (lda = k), op(A) = A^T gives [n, k]; x seen column-major is
  // [k, m] (ldb = k).
  const float alpha = 1.f, beta = 0.f;
  const cudaDataType_t t = CudaType(dm->type());
  Record(DUET_CUBLAS_STATUS(cublasGemmEx(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha,
                                         dm->data(), t, k, a_in, t, k, &beta, y, CUDA_R_32F, n,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)));
  if (bias != nullptr) {
    LaunchAddBias(y, bias, m, n, stream_.get());
    CheckLaunch("AddBias");
  }
}

void CudaBackend::RmsNorm(const float* x, const float* weight, int rows, int dim, float eps,
                          float* y) {
  auto lock = Enter();
  LaunchRmsNorm(x, weight, rows, dim, eps, y, stream_.get());
  CheckLaunch("RmsNorm");
}

void CudaBackend::AddRmsNorm(float* x, const float* residual, const float* weight, int rows,
                             int dim, float eps, float* y) {
  auto lock = Enter();
  LaunchAddRmsNorm(x, residual, weight, rows, dim, eps, y, stream_.get());
  CheckLaunch("AddRmsNorm");
}

void CudaBackend::Add(float* y, const float* x, int64_t n) {
  auto lock = Enter();
  LaunchAdd(y, x, n, stream_.get());
  CheckLaunch("Add");
}

void CudaBackend::Rope(float* x, int rows, int num_heads, int head_dim, const int32_t* positions,
                       const RopeParams& rope) {
  if (rows <= 0) return;
  auto lock = Enter();
  const auto* pos = static_cast<const int32_t*>(
      Upload(kPositions, positions, static_cast<size_t>(rows) * sizeof(int32_t)));
  const auto* freq = static_cast<const float*>(
      Upload(kInvFreq, rope.inv_freq.data(), rope.inv_freq.size() * sizeof(float)));
  if (pos == nullptr || freq == nullptr) return;
  LaunchRope(x, rows, num_heads, head_dim, pos, freq, static_cast<int>(rope.inv_freq.size()),
             stream_.get());
  CheckLaunch("Rope");
}

void CudaBackend::SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  auto lock = Enter();
  LaunchSwiGlu(gate, up, n, out, stream_.get());
  CheckLaunch("SwiGlu");
}

void CudaBackend::GeluTanhGlu(const float* gate, const float* up, int64_t n, float* out) {
  auto lock = Enter();
  LaunchGeluTanhGlu(gate, up, n, out, stream_.get());
  CheckLaunch("GeluTanhGlu");
}

void CudaBackend::Embed(const float* table, int dim, const int32_t* ids, int n, float* out) {
  if (n <= 0) return;
  auto lock = Enter();
  const auto* dids =
      static_cast<const int32_t*>(Upload(kIds, ids, static_cast<size_t>(n) * sizeof(int32_t)));
  if (dids == nullptr) return;
  LaunchEmbed(table, dim, dids, n, out, stream_.get());
  CheckLaunch("Embed");
}

void CudaBackend::WriteKv(const kv::KvCacheView& cache, int layer, const float* k, const float* v,
                          const int64_t* slots, int n) {
  if (n <= 0) return;
  auto lock = Enter();
  if (layer < 0 || layer >= cache.layout.num_layers) {
    Record(absl::InvalidArgumentError(absl::StrCat("WriteKv: layer ", layer, " out of range")));
    return;
  }
  for (int i = 0; i < n; ++i) {
    if (slots[i] < 0 || slots[i] / cache.layout.block_size >= cache.num_blocks) {
      Record(absl::InvalidArgumentError(absl::StrCat("WriteKv: slot ", slots[i], " outside ",
                                                     cache.num_blocks, " blocks")));
      return;
    }
  }
  const auto* dslots =
      static_cast<const int64_t*>(Upload(kSlots, slots, static_cast<size_t>(n) * sizeof(int64_t)));
  if (dslots == nullptr) return;
  LaunchWriteKv(CacheArgs(cache, layer), k, v, dslots, n, stream_.get());
  CheckLaunch("WriteKv");
}

void CudaBackend::PagedAttention(const kv::KvCacheView& cache, int layer, const float* q,
                                 absl::Span<const AttentionSeq> seqs,
                                 const AttentionParams& params, float* out) {
  auto lock = Enter();
  const kv::KvLayout& lay = cache.layout;
  if (params.num_kv_heads != lay.num_kv_heads || params.head_dim != lay.head_dim ||
      params.num_kv_heads <= 0 || params.num_q_heads % params.num_kv_heads != 0 ||
      params.head_dim > kMaxHeadDim || layer < 0 || layer >= lay.num_layers) {
    Record(absl::InvalidArgumentError(absl::StrCat(
        "PagedAttention: heads ", params.num_q_heads, "/", params.num_kv_heads, " head_dim ",
        params.head_dim, " layer ", layer, " do not fit the cache ", lay.Describe(),
        " (head_dim <= ", kMaxHeadDim, ")")));
    return;
  }
  // One host buffer: [DevSeq x S][tables][prefill tiles (int2)][decode rows (int4)], each part
  // 16-byte aligned; uploaded once per distinct content.
  std::vector<DevSeq> dseqs;
  std::vector<int32_t> tables;
  std::vector<int2> tiles;
  std::vector<int4> rows;
  int max_splits = 1;
  const bool tensor = tensor_prefill_ && TensorPrefillSupports(lay.head_dim);
  const int tile_rows = tensor ? kTensorPrefillTileRows : kPrefillTileRows;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const AttentionSeq& s = seqs[si];
    if (s.q_len < 0 || s.q_len > s.context_len ||
        static_cast<int64_t>(s.num_table_blocks) * lay.block_size < s.context_len) {
      Record(absl::InvalidArgumentError(absl::StrCat(
          "PagedAttention: sequence ", si, " has q_len ", s.q_len, ", context ", s.context_len,
          " and ", s.num_table_blocks, " blocks of ", lay.block_size)));
      return;
    }
    dseqs.push_back({s.q_start, s.q_len, s.context_len, static_cast<int32_t>(tables.size())});
    const int need_blocks = static_cast<int>((s.context_len + lay.block_size - 1) / lay.block_size);
    for (int b = 0; b < need_blocks; ++b) {
      if (s.block_table[b] < 0 || s.block_table[b] >= cache.num_blocks) {
        Record(absl::InvalidArgumentError(absl::StrCat("PagedAttention: sequence ", si,
                                                       " names block ", s.block_table[b])));
        return;
      }
      tables.push_back(s.block_table[b]);
    }
    if (s.q_len <= kDecodePathMaxQLen) {
      for (int r = 0; r < s.q_len; ++r) {
        const int pos = s.context_len - s.q_len + r;
        const int lo = params.sliding_window > 0 ? std::max(0, pos - params.sliding_window + 1) : 0;
        const int splits = (pos + 1 - lo + kDecodeSplitKeys - 1) / kDecodeSplitKeys;
        rows.push_back(make_int4(static_cast<int>(si), r, splits, 0));
        max_splits = std::max(max_splits, splits);
      }
    } else {
      for (int r = 0; r < s.q_len; r += tile_rows) tiles.push_back(make_int2(static_cast<int>(si), r));
    }
  }
  auto align16 = [](size_t b) { return (b + 15) / 16 * 16; };
  const size_t seq_bytes = align16(dseqs.size() * sizeof(DevSeq));
  const size_t table_bytes = align16(tables.size() * sizeof(int32_t));
  const size_t tile_bytes = align16(tiles.size() * sizeof(int2));
  const size_t row_bytes = rows.size() * sizeof(int4);
  std::vector<uint8_t> host(seq_bytes + table_bytes + tile_bytes + row_bytes, 0);
  std::memcpy(host.data(), dseqs.data(), dseqs.size() * sizeof(DevSeq));
  std::memcpy(host.data() + seq_bytes, tables.data(), tables.size() * sizeof(int32_t));
  std::memcpy(host.data() + seq_bytes + table_bytes, tiles.data(), tiles.size() * sizeof(int2));
  std::memcpy(host.data() + seq_bytes + table_bytes + tile_bytes, rows.data(), row_bytes);
  const auto* dev = static_cast<const uint8_t*>(Upload(kAttention, host.data(), host.size()));
  if (dev == nullptr) return;

  AttentionMeta meta;
  meta.seqs = reinterpret_cast<const DevSeq*>(dev);
  meta.tables = reinterpret_cast<const int32_t*>(dev + seq_bytes);
  meta.prefill_tiles = reinterpret_cast<const int2*>(dev + seq_bytes + table_bytes);
  meta.num_prefill_tiles = static_cast<int>(tiles.size());
  meta.decode_rows = reinterpret_cast<const int4*>(dev + seq_bytes + table_bytes + tile_bytes);
  meta.num_decode_rows = static_cast<int>(rows.size());
  meta.max_splits = max_splits;
  meta.tensor_core_prefill = tensor;
  meta.num_q_heads = params.num_q_heads;
  meta.scale = params.scale;
  meta.sliding_window = params.sliding_window;
  float* partials = nullptr;
  if (meta.num_decode_rows > 0) {
    const int64_t floats = DecodePartialFloats(meta, lay.head_dim);
    if (!Reserve(&attn_partials_, floats * sizeof(float))) return;
    partials = attn_partials_.as<float>();
  }
  if (!LaunchPagedAttention(CacheArgs(cache, layer), q, meta, out, partials, stream_.get())) {
    Record(absl::InvalidArgumentError(absl::StrCat("PagedAttention: head_dim ", lay.head_dim,
                                                   " unsupported")));
    return;
  }
  CheckLaunch("PagedAttention");
}

std::shared_ptr<WorkMarker> CudaBackend::MarkQueuedWork() {
  auto lock = Enter();
  absl::StatusOr<Event> ev = Event::Create(/*timing=*/false);
  if (!ev.ok()) {
    Record(ev.status());
    Record(DUET_CUDA_STATUS(cudaStreamSynchronize(stream_.get())));
    return ComputeBackend::MarkQueuedWork();  // synchronised: already done
  }
  Record(DUET_CUDA_STATUS(cudaEventRecord(ev->get(), stream_.get())));
  return std::make_shared<CudaWorkMarker>(device_, std::move(ev).value());
}

absl::StatusOr<std::shared_ptr<WorkMarker>> CudaBackend::CopyKvAsync(
    const kv::KvCacheView& from, const kv::KvCacheView& to, int layer,
    absl::Span<const kv::BlockId> blocks, const WorkMarker* after, cudaMemcpyKind kind,
    const char* what) {
  DUET_ASSIGN_OR_RETURN(std::vector<KvCopyRun> runs, PlanKvCopy(from, to, layer, blocks, what));
  auto lock = Enter();
  if (after != nullptr) {
    const auto* marker = dynamic_cast<const CudaWorkMarker*>(after);
    if (marker != nullptr) {
      DUET_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_.get(), marker->event(), 0));
    } else if (!const_cast<WorkMarker*>(after)->Done()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": marker from another backend"));
    }
  }
  for (const KvCopyRun& r : runs) {
    DUET_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(to.base) + r.offset,
                                    static_cast<const uint8_t*>(from.base) + r.offset, r.bytes,
                                    kind, copy_stream_.get()));
  }
  DUET_ASSIGN_OR_RETURN(Event done, Event::Create(/*timing=*/false));
  DUET_CUDA_CHECK(cudaEventRecord(done.get(), copy_stream_.get()));
  return std::shared_ptr<WorkMarker>(std::make_shared<CudaWorkMarker>(device_, std::move(done)));
}

absl::StatusOr<std::shared_ptr<WorkMarker>> CudaBackend::CopyKvToHost(
    const kv::KvCacheView& pool, int layer, absl::Span<const kv::BlockId> blocks,
    const kv::KvCacheView& mirror, const WorkMarker* after) {
  return CopyKvAsync(pool, mirror, layer, blocks, after, cudaMemcpyDeviceToHost, "CopyKvToHost");
}

absl::StatusOr<std::shared_ptr<WorkMarker>> CudaBackend::CopyKvFromHost(
    const kv::KvCacheView& mirror, int layer, absl::Span<const kv::BlockId> blocks,
    const kv::KvCacheView& pool, const WorkMarker* after) {
  return CopyKvAsync(mirror, pool, layer, blocks, after, cudaMemcpyHostToDevice,
                     "CopyKvFromHost");
}

bool RegisterCudaBackend() {
  return RegisterBackendFactory(
      "cuda", BackendFactory{
                  .device_count = []() -> absl::StatusOr<int> { return CudaDeviceCount(); },
                  .create = [](const BackendOptions& o)
                      -> absl::StatusOr<std::unique_ptr<ComputeBackend>> {
                    DUET_ASSIGN_OR_RETURN(auto b, CudaBackend::Create(o));
                    return std::unique_ptr<ComputeBackend>(std::move(b));
                  }});
}

}  // namespace duet::compute::cuda
