#include "common/weights/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/weights/gguf_quant.h"

namespace duet::model {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
constexpr uint64_t kMaxStringBytes = uint64_t{1} << 30;

// A bounds-checked little-endian reader over the file's bytes. Every read names what it reads
// so errors say where the file is short.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  absl::Status Fail(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", what));
  }

  template <typename T>
  absl::Status Read(T* out, const std::string& what) {
    if (remaining() < sizeof(T)) {
      return Fail(absl::StrCat("truncated at byte ", pos_, " reading ", what, " (needs ", sizeof(T),
                               " bytes, ", remaining(), " left)"));
    }
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string* out, const std::string& what) {
    uint64_t len;
    DUET_RETURN_IF_ERROR(Read(&len, what + " length"));
    if (len > remaining() || len > kMaxStringBytes) {
      return Fail(absl::StrCat(what, ": string length ", len, " exceeds the ", remaining(),
                               " bytes left in the file"));
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return absl::OkStatus();
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

// Bytes one element of `type` takes at least (strings: their 8-byte length); 0 if unknown.
uint64_t MinElementBytes(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
    case GgufType::kString:
      return 8;
    case GgufType::kArray:
      return 12;
  }
  return 0;
}

bool IsIntegerType(GgufType t) {
  return t == GgufType::kUint8 || t == GgufType::kInt8 || t == GgufType::kUint16 ||
         t == GgufType::kInt16 || t == GgufType::kUint32 || t == GgufType::kInt32 ||
         t == GgufType::kUint64 || t == GgufType::kInt64 || t == GgufType::kBool;
}

// Reads one scalar of `type` as an integer or a float.
absl::Status ReadScalar(Reader& r, GgufType type, int64_t* i, double* f, const std::string& what) {
  switch (type) {
#define DUET_GGUF_INT_CASE(enumerator, ctype) \
  case GgufType::enumerator: {                \
    ctype v;                                  \
    DUET_RETURN_IF_ERROR(r.Read(&v, what));   \
    *i = static_cast<int64_t>(v);             \
    return absl::OkStatus();                  \
  }
    DUET_GGUF_INT_CASE(kUint8, uint8_t)
    DUET_GGUF_INT_CASE(kInt8, int8_t)
    DUET_GGUF_INT_CASE(kUint16, uint16_t)
    DUET_GGUF_INT_CASE(kInt16, int16_t)
    DUET_GGUF_INT_CASE(kUint32, uint32_t)
    DUET_GGUF_INT_CASE(kInt32, int32_t)
    DUET_GGUF_INT_CASE(kUint64, uint64_t)
    DUET_GGUF_INT_CASE(kInt64, int64_t)
#undef DUET_GGUF_INT_CASE
    case GgufType::kBool: {
      uint8_t v;
      DUET_RETURN_IF_ERROR(r.Read(&v, what));
      if (v > 1) return r.Fail(absl::StrCat(what, ": bool value ", v, " is not 0 or 1"));
      *i = v;
      return absl::OkStatus();
    }
    case GgufType::kFloat32: {
      float v;
      DUET_RETURN_IF_ERROR(r.Read(&v, what));
      *f = v;
      return absl::OkStatus();
    }
    case GgufType::kFloat64: {
      double v;
      DUET_RETURN_IF_ERROR(r.Read(&v, what));
      *f = v;
      return absl::OkStatus();
    }
    default:
      break;
  }
  return r.Fail(absl::StrCat(what, ": not a scalar type"));
}

absl::Status ReadValue(Reader& r, GgufType type, GgufValue* v, const std::string& what) {
  v->type = type;
  if (MinElementBytes(type) == 0) {
    return r.Fail(absl::StrCat(what, ": unknown value type ", static_cast<uint32_t>(type),
                               " (expected 0..12)"));
  }
  if (type == GgufType::kString) return r.ReadString(&v->string_value, what);
  if (type != GgufType::kArray) return ReadScalar(r, type, &v->int_value, &v->float_value, what);

  uint32_t elem;
  DUET_RETURN_IF_ERROR(r.Read(&elem, what + " element type"));
  const GgufType et = static_cast<GgufType>(elem);
  v->array_type = et;
  if (MinElementBytes(et) == 0) {
    return r.Fail(absl::StrCat(what, ": unknown array element type ", elem, " (expected 0..12)"));
  }
  if (et == GgufType::kArray) {
    return r.Fail(absl::StrCat(what, ": nested arrays are not supported"));
  }
  uint64_t n;
  DUET_RETURN_IF_ERROR(r.Read(&n, what + " array length"));
  if (n > r.remaining() / MinElementBytes(et)) {
    return r.Fail(absl::StrCat(what, ": array of ", n, " ", GgufTypeName(et),
                               " elements does not fit the ", r.remaining(),
                               " bytes left in the file"));
  }
  if (et == GgufType::kString) {
    v->strings.resize(static_cast<size_t>(n));
    for (uint64_t k = 0; k < n; ++k) {
      DUET_RETURN_IF_ERROR(r.ReadString(&v->strings[k], absl::StrCat(what, "[", k, "]")));
    }
  } else if (et == GgufType::kFloat32 || et == GgufType::kFloat64) {
    v->floats.resize(static_cast<size_t>(n));
    int64_t unused;
    for (uint64_t k = 0; k < n; ++k) {
      DUET_RETURN_IF_ERROR(ReadScalar(r, et, &unused, &v->floats[k], what));
    }
  } else {
    v->ints.resize(static_cast<size_t>(n));
    double unused;
    for (uint64_t k = 0; k < n; ++k) {
      DUET_RETURN_IF_ERROR(ReadScalar(r, et, &v->ints[k], &unused, what));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* GgufTypeName(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
      return "uint8";
    case GgufType::kInt8:
      return "int8";
    case GgufType::kUint16:
      return "uint16";
    case GgufType::kInt16:
      return "int16";
    case GgufType::kUint32:
      return "uint32";
    case GgufType::kInt32:
      return "int32";
    case GgufType::kFloat32:
      return "float32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kUint64:
      return "uint64";
    case GgufType::kInt64:
      return "int64";
    case GgufType::kFloat64:
      return "float64";
  }
  return "unknown";
}

std::string GgmlTypeName(uint32_t type) {
  const GgmlTypeInfo* info = FindGgmlType(type);
  return info ? std::string(info->name) : absl::StrCat("type ", type);
}

bool GgufValue::is_integer() const { return IsIntegerType(type); }

uint64_t GgufValue::array_size() const {
  if (type != GgufType::kArray) return 0;
  return strings.size() + floats.size() + ints.size();
}

int64_t GgufTensorInfo::NumElements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;  // validated at open: no overflow
  return n;
}

std::vector<int64_t> GgufTensorInfo::Shape() const {
  return std::vector<int64_t>(dims.rbegin(), dims.rend());
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  DUET_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mf, MappedFile::Open(path));
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->file_ = std::move(mf);
  DUET_RETURN_IF_ERROR(f->Parse(f->file_->data(), f->file_->size()));
  return f;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(const uint8_t* data, size_t size,
                                                              const std::string& name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = name;
  f->bytes_.assign(data, data + size);
  DUET_RETURN_IF_ERROR(f->Parse(f->bytes_.data(), f->bytes_.size()));
  return f;
}

absl::Status GgufFile::Parse(const uint8_t* data, size_t size) {
  Reader r(data, size, path_);
  uint32_t magic;
  DUET_RETURN_IF_ERROR(r.Read(&magic, "the magic number"));
  if (magic != kMagic) {
    return r.Fail(absl::StrCat("not a GGUF file: magic 0x", absl::Hex(magic),
                               ", expected 0x46554747 (\"GGUF\")"));
  }
  DUET_RETURN_IF_ERROR(r.Read(&version_, "the version"));
  if (version_ != 2 && version_ != 3) {
    return r.Fail(absl::StrCat("GGUF version ", version_, " is not supported (expected 2 or 3)"));
  }
  uint64_t n_tensors, n_kv;
  DUET_RETURN_IF_ERROR(r.Read(&n_tensors, "the tensor count"));
  DUET_RETURN_IF_ERROR(r.Read(&n_kv, "the metadata count"));
  // A key/value takes >= 8 (key length) + 4 (type) + 1 bytes; a tensor info >= 8 + 4 + 4 + 8.
  if (n_kv > r.remaining() / 13) {
    return r.Fail(
        absl::StrCat("metadata count ", n_kv, " does not fit the file (", size, " bytes)"));
  }
  if (n_tensors > r.remaining() / 24) {
    return r.Fail(
        absl::StrCat("tensor count ", n_tensors, " does not fit the file (", size, " bytes)"));
  }
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    DUET_RETURN_IF_ERROR(r.ReadString(&key, absl::StrCat("metadata key #", k)));
    uint32_t type;
    DUET_RETURN_IF_ERROR(r.Read(&type, "the type of metadata key '" + key + "'"));
    GgufValue value;
    DUET_RETURN_IF_ERROR(
        ReadValue(r, static_cast<GgufType>(type), &value, "metadata key '" + key + "'"));
    if (!metadata_.emplace(key, std::move(value)).second) {
      return r.Fail("duplicate metadata key '" + key + "'");
    }
  }
  if (const GgufValue* a = Find("general.alignment")) {
    if (!a->is_integer() || a->int_value <= 0 || a->int_value > (1 << 20) ||
        (a->int_value & (a->int_value - 1)) != 0) {
      return r.Fail(
          absl::StrCat("metadata key 'general.alignment': expected a power of two "
                       "integer up to 2^20, got ",
                       GgufTypeName(a->type), " ", a->int_value));
    }
    alignment_ = static_cast<uint64_t>(a->int_value);
  }

  tensors_.resize(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo& t = tensors_[k];
    DUET_RETURN_IF_ERROR(r.ReadString(&t.name, absl::StrCat("the name of tensor #", k)));
    const std::string what = "tensor '" + t.name + "'";
    uint32_t n_dims;
    DUET_RETURN_IF_ERROR(r.Read(&n_dims, what + " dimension count"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return r.Fail(absl::StrCat(what, ": ", n_dims, " dimensions; expected 1 to ", kMaxDims));
    }
    t.dims.resize(n_dims);
    int64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim;
      DUET_RETURN_IF_ERROR(r.Read(&dim, what + " dimension"));
      if (dim == 0 || dim > (uint64_t{1} << 40) ||
          static_cast<uint64_t>(elements) > (uint64_t{1} << 42) / dim) {
        return r.Fail(absl::StrCat(what, ": dimension ", d, " is ", dim,
                                   "; expected 1..2^40 with at most 2^42 elements in all"));
      }
      t.dims[d] = static_cast<int64_t>(dim);
      elements *= static_cast<int64_t>(dim);
    }
    DUET_RETURN_IF_ERROR(r.Read(&t.type, what + " type"));
    DUET_RETURN_IF_ERROR(r.Read(&t.offset, what + " offset"));
    const GgmlTypeInfo* info = FindGgmlType(t.type);
    if (info == nullptr) {
      return r.Fail(absl::StrCat(what, ": unknown ggml type ", t.type));
    }
    if (t.dims[0] % info->block_size != 0) {
      return r.Fail(absl::StrCat(what, ": first dimension ", t.dims[0], " is not a multiple of ",
                                 info->name, "'s block size ", info->block_size));
    }
    t.nbytes = static_cast<size_t>(elements / info->block_size) * info->type_size;
    if (t.offset % alignment_ != 0) {
      return r.Fail(absl::StrCat(what, ": data offset ", t.offset, " is not a multiple of the ",
                                 "alignment ", alignment_));
    }
    if (!by_name_.emplace(t.name, k).second) return r.Fail("duplicate " + what);
  }

  const uint64_t data_start = (r.pos() + alignment_ - 1) / alignment_ * alignment_;
  const uint64_t data_size = data_start <= size ? size - data_start : 0;
  std::vector<std::pair<uint64_t, size_t>> ranges;  // (offset, tensor index)
  for (size_t k = 0; k < tensors_.size(); ++k) {
    GgufTensorInfo& t = tensors_[k];
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      return r.Fail(absl::StrCat("tensor '", t.name, "' (", GgmlTypeName(t.type), " ",
                                 ShapeToString(t.Shape()), ", ", t.nbytes, " bytes at data offset ",
                                 t.offset, ") extends past the end of the file (data section of ",
                                 data_size, " bytes from byte ", data_start, ")"));
    }
    t.data = data + data_start + t.offset;
    ranges.emplace_back(t.offset, k);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t k = 1; k < ranges.size(); ++k) {
    const GgufTensorInfo& prev = tensors_[ranges[k - 1].second];
    const GgufTensorInfo& cur = tensors_[ranges[k].second];
    if (prev.offset + prev.nbytes > cur.offset) {
      return r.Fail("tensors '" + prev.name + "' and '" + cur.name + "' overlap");
    }
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {

absl::Status WrongType(const std::string& path, const std::string& key, const GgufValue& v,
                       const char* expected) {
  std::string got = GgufTypeName(v.type);
  if (v.type == GgufType::kArray) got = absl::StrCat("array of ", GgufTypeName(v.array_type));
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": metadata key '", key, "' is ", got, "; expected ", expected));
}

}  // namespace

absl::StatusOr<std::optional<int64_t>> GgufFile::GetOptionalInt(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_integer()) return WrongType(path_, key, *v, "an integer");
  if (v->type == GgufType::kUint64 && v->int_value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": metadata key '", key, "' is a uint64 above 2^63"));
  }
  return std::optional<int64_t>(v->int_value);
}

absl::StatusOr<std::optional<double>> GgufFile::GetOptionalFloat(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<double>();
  if (v->type == GgufType::kFloat32 || v->type == GgufType::kFloat64) {
    return std::optional<double>(v->float_value);
  }
  if (v->is_integer() && v->type != GgufType::kBool) {
    return std::optional<double>(static_cast<double>(v->int_value));
  }
  return WrongType(path_, key, *v, "a number");
}

absl::StatusOr<std::optional<std::string>> GgufFile::GetOptionalString(
    const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<std::string>();
  if (v->type != GgufType::kString) return WrongType(path_, key, *v, "a string");
  return std::optional<std::string>(v->string_value);
}

namespace {
absl::Status Missing(const std::string& path, const std::string& key) {
  return absl::NotFoundError(path + ": no metadata key '" + key + "'");
}
}  // namespace

absl::StatusOr<int64_t> GgufFile::GetInt(const std::string& key) const {
  DUET_ASSIGN_OR_RETURN(std::optional<int64_t> v, GetOptionalInt(key));
  if (!v) return Missing(path_, key);
  return *v;
}

absl::StatusOr<double> GgufFile::GetFloat(const std::string& key) const {
  DUET_ASSIGN_OR_RETURN(std::optional<double> v, GetOptionalFloat(key));
  if (!v) return Missing(path_, key);
  return *v;
}

absl::StatusOr<bool> GgufFile::GetBool(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (v->type != GgufType::kBool) return WrongType(path_, key, *v, "a bool");
  return v->int_value != 0;
}

absl::StatusOr<std::string> GgufFile::GetString(const std::string& key) const {
  DUET_ASSIGN_OR_RETURN(std::optional<std::string> v, GetOptionalString(key));
  if (!v) return Missing(path_, key);
  return *v;
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (v->type != GgufType::kArray || v->array_type != GgufType::kString) {
    return WrongType(path_, key, *v, "an array of strings");
  }
  return v->strings;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (v->type != GgufType::kArray || !IsIntegerType(v->array_type)) {
    return WrongType(path_, key, *v, "an array of integers");
  }
  return v->ints;
}

absl::StatusOr<const GgufTensorInfo*> GgufFile::Tensor(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return absl::NotFoundError(path_ + ": no tensor '" + name + "'");
  return &tensors_[it->second];
}

absl::Status GgufFile::Dequantize(const GgufTensorInfo& t, float* dst) const {
  return Annotate(DequantizeBlocks(t.type, t.data, t.NumElements(), dst),
                  path_ + ": tensor '" + t.name + "'");
}

}  // namespace duet::model
