// Read-only GGUF (v2, v3) files through mmap: header, metadata key/values and tensor infos, all
// validated when the file opens (every length, count, dimension and offset is bounds-checked
// against the file), and dequantisation of tensors to float32 (gguf_quant.h).
//
//   DUET_ASSIGN_OR_RETURN(auto gguf, GgufFile::Open("models/smollm2.gguf"));
//   DUET_ASSIGN_OR_RETURN(std::string arch, gguf->GetString("general.architecture"));
//   DUET_ASSIGN_OR_RETURN(const GgufTensorInfo* t, gguf->Tensor("token_embd.weight"));
//   std::vector<float> w(t->NumElements());
//   DUET_RETURN_IF_ERROR(gguf->Dequantize(*t, w.data()));
//
// Errors name the file, the key or tensor, and what was expected; malformed files never crash.
// Model-level loading (ModelConfig, ModelWeights) is in gguf_model.h.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/weights/safetensors.h"

namespace duet::model {

// Metadata value types, numbered as in the GGUF specification.
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
const char* GgufTypeName(GgufType type);

// ggml tensor types this reader knows (numbers from ggml.h). Dequantize supports F32, F16, BF16,
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q2_K to Q8_K; the others are recognised so
// errors can name them.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kBF16 = 30,
};
// Name ("Q4_1"), or "type N" for an unknown number.
std::string GgmlTypeName(uint32_t type);

// One metadata value. Integers (and bools) are kept in int_value; a uint64 above INT64_MAX is
// stored bit for bit and refused by GgufFile::GetInt. Arrays keep one vector by element kind.
struct GgufValue {
  GgufType type = GgufType::kUint8;
  GgufType array_type = GgufType::kUint8;  // element type when type == kArray
  int64_t int_value = 0;
  double float_value = 0;
  std::string string_value;
  std::vector<int64_t> ints;  // integer and bool arrays
  std::vector<double> floats;
  std::vector<std::string> strings;

  bool is_integer() const;  // every integer type and bool
  uint64_t array_size() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the innermost (contiguous) dimension
  uint32_t type = 0;          // a GgmlType value
  uint64_t offset = 0;        // from the start of the data section
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t NumElements() const;
  // Row-major shape, outermost first (the reverse of dims): a [out, in] matrix is dims {in, out}.
  std::vector<int64_t> Shape() const;
};

class GgufFile {
 public:
  // Maps and parses `path`.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses a copy of `size` bytes; `name` stands for the file in messages (fuzzers, tests).
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBytes(const uint8_t* data, size_t size,
                                                             const std::string& name);
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // The file's mapping (null when parsed from a copy): tensors' data point into it, and holding
  // it keeps them valid after this object is gone.
  const std::shared_ptr<const MappedFile>& mapping() const { return file_; }

  const GgufValue* Find(const std::string& key) const;
  // NotFound "<file>: no metadata key '<key>'" or InvalidArgument naming the key, its type and
  // the expected one.
  absl::StatusOr<int64_t> GetInt(const std::string& key) const;
  absl::StatusOr<double> GetFloat(const std::string& key) const;  // float or integer types
  absl::StatusOr<bool> GetBool(const std::string& key) const;
  absl::StatusOr<std::string> GetString(const std::string& key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(const std::string& key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(const std::string& key) const;
  // As above, std::nullopt when the key is absent (a present key of the wrong type is an error).
  absl::StatusOr<std::optional<int64_t>> GetOptionalInt(const std::string& key) const;
  absl::StatusOr<std::optional<double>> GetOptionalFloat(const std::string& key) const;
  absl::StatusOr<std::optional<std::string>> GetOptionalString(const std::string& key) const;

  bool HasTensor(const std::string& name) const { return by_name_.count(name) != 0; }
  // NotFound "<file>: no tensor '<name>'".
  absl::StatusOr<const GgufTensorInfo*> Tensor(const std::string& name) const;
  // Converts the whole tensor to float32 into dst (t.NumElements() floats). Unsupported types
  // are Unimplemented naming the tensor and the supported types.
  absl::Status Dequantize(const GgufTensorInfo& t, float* dst) const;

 private:
  GgufFile() = default;
  absl::Status Parse(const uint8_t* data, size_t size);

  std::string path_;
  std::shared_ptr<const MappedFile> file_;  // when opened from a file
  std::vector<uint8_t> bytes_;        // when parsed from a copy
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
};

}  // namespace duet::model
