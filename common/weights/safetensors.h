// Read-only access to safetensors checkpoints through mmap: one file (model.safetensors) or a
// sharded set (model.safetensors.index.json + shards). Every tensor's header entry is validated
// when a file opens (dtype, shape, data_offsets inside the data section and consistent with
// shape * dtype size, no overlaps), so a TensorView's bytes are always in bounds.
//
//   DUET_ASSIGN_OR_RETURN(auto ckpt, SafetensorsCheckpoint::OpenDir(model_dir));
//   DUET_ASSIGN_OR_RETURN(TensorView t, ckpt->GetWithShape("model.norm.weight", {576}));
//   std::vector<float> w(t.NumElements());
//   DUET_RETURN_IF_ERROR(ConvertToFloat(t, w.data()));   // F32/F16/BF16 -> float32
//
// Errors name the file, the tensor and what was expected; malformed files never crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/scoped_fd.h"

namespace duet::model {

enum class Dtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool, kF8E4M3, kF8E5M2 };

// "F32" -> kF32, ...; unknown names are InvalidArgument listing the known ones.
absl::StatusOr<Dtype> ParseDtype(const std::string& name);
const char* DtypeName(Dtype dtype);
size_t DtypeSize(Dtype dtype);
std::string ShapeToString(const std::vector<int64_t>& shape);  // "[3, 4]"

// munmap()s a mapping of `size` bytes.
struct Unmapper {
  size_t size = 0;
  void operator()(const uint8_t* p) const noexcept;
};

// A read-only memory mapping of a whole file. Non-copyable; unmaps, then closes, on destruction.
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return mapping_.get(); }  // nullptr for an empty file
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Takes the pages under [p, p + n) (inside the mapping) out of this process's resident
  // memory: they stay in the page cache, and are read in again if touched. For bytes that have
  // been copied or repacked elsewhere.
  void DropPages(const uint8_t* p, size_t n) const;

 private:
  MappedFile(std::string path, ScopedFd fd, std::unique_ptr<const uint8_t, Unmapper> mapping,
             size_t size)
      : path_(std::move(path)), fd_(std::move(fd)), mapping_(std::move(mapping)), size_(size) {}
  std::string path_;
  ScopedFd fd_;                                       // created first, closed last
  std::unique_ptr<const uint8_t, Unmapper> mapping_;  // removed before fd_ closes
  size_t size_ = 0;
};

// A tensor inside a mapped file; valid while its SafetensorsFile/Checkpoint lives.
struct TensorView {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // not necessarily aligned: read with memcpy
  size_t nbytes = 0;
  std::string file;  // path of the file holding it

  int64_t NumElements() const;
};

// One .safetensors file: 8-byte little-endian header length, JSON header, data section.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::vector<std::string> TensorNames() const;  // sorted
  bool Has(const std::string& name) const { return entries_.count(name) != 0; }
  size_t num_tensors() const { return entries_.size(); }
  // NotFound "<file>: no tensor '<name>'".
  absl::StatusOr<TensorView> Get(const std::string& name) const;

 private:
  struct Entry {
    Dtype dtype;
    std::vector<int64_t> shape;
    size_t begin;  // absolute offsets into the mapping
    size_t end;
  };
  explicit SafetensorsFile(std::unique_ptr<MappedFile> file) : file_(std::move(file)) {}
  absl::Status ParseHeader();

  std::unique_ptr<MappedFile> file_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint: a single file or the shards named by an index's weight_map.
class SafetensorsCheckpoint {
 public:
  // model_dir/model.safetensors if present, else model_dir/model.safetensors.index.json.
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> OpenDir(
      const std::string& model_dir);
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> OpenFile(const std::string& path);
  // Opens each shard once and checks that every tensor of the weight_map is in its shard.
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> OpenIndex(
      const std::string& index_path);

  // What was opened: the file, or the index.
  const std::string& source() const { return source_; }
  std::vector<std::string> TensorNames() const;  // sorted
  bool Has(const std::string& name) const { return where_.count(name) != 0; }
  // NotFound naming the checkpoint and the tensor.
  absl::StatusOr<TensorView> Get(const std::string& name) const;
  // As Get, plus InvalidArgument when the shape differs: "<file>: tensor '<name>' has shape
  // [a, b]; expected [c, d]<what>" where `what` explains the expectation (e.g. " =
  // [vocab_size, hidden_size]").
  absl::StatusOr<TensorView> GetWithShape(const std::string& name,
                                          const std::vector<int64_t>& shape,
                                          const std::string& what = "") const;

 private:
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

// Converts n elements of `dtype` at `src` (any alignment) to float32. F32, F16, BF16 and F64
// are supported; other dtypes are InvalidArgument.
absl::Status ConvertToFloat(Dtype dtype, const uint8_t* src, size_t n, float* dst);
// Converts a whole tensor; `dst` holds t.NumElements() floats. The error names tensor and file.
absl::Status ConvertToFloat(const TensorView& t, float* dst);
absl::StatusOr<std::vector<float>> ToFloatVector(const TensorView& t);

}  // namespace duet::model
