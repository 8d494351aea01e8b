#include "common/weights/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/float16.h"
#include "common/base/json_util.h"
#include "common/base/status.h"
#include "nlohmann/json.hpp"

namespace duet::model {
namespace {

struct DtypeInfo {
  Dtype dtype;
  const char* name;
  size_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {Dtype::kF64, "F64", 8},   {Dtype::kF32, "F32", 4},        {Dtype::kF16, "F16", 2},
    {Dtype::kBF16, "BF16", 2}, {Dtype::kI64, "I64", 8},        {Dtype::kI32, "I32", 4},
    {Dtype::kI16, "I16", 2},   {Dtype::kI8, "I8", 1},          {Dtype::kU8, "U8", 1},
    {Dtype::kBool, "BOOL", 1}, {Dtype::kF8E4M3, "F8_E4M3", 1}, {Dtype::kF8E5M2, "F8_E5M2", 1},
};

// The safetensors format caps the header at 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

absl::StatusOr<Dtype> ParseDtype(const std::string& name) {
  std::vector<std::string> known;
  for (const DtypeInfo& d : kDtypes) {
    if (name == d.name) return d.dtype;
    known.push_back(d.name);
  }
  return absl::InvalidArgumentError("unknown dtype '" + name + "'; expected one of " +
                                    absl::StrJoin(known, ", "));
}

const char* DtypeName(Dtype dtype) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "?";
}

size_t DtypeSize(Dtype dtype) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.dtype == dtype) return d.size;
  }
  return 0;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  return "[" + absl::StrJoin(shape, ", ") + "]";
}

int64_t TensorView::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// MappedFile

void Unmapper::operator()(const uint8_t* p) const noexcept {
  if (p != nullptr) ::munmap(const_cast<uint8_t*>(p), size);
}

void MappedFile::DropPages(const uint8_t* p, size_t n) const {
  const uint8_t* base = mapping_.get();
  if (base == nullptr || n == 0 || p < base || p + n > base + size_) return;
  static const uintptr_t kPage = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  // Whole pages only: the partial ones at either end may hold bytes not yet used.
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) & ~(kPage - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    const int err = errno;
    std::string msg = path + ": cannot open: " + std::strerror(err);
    if (err == ENOENT) return absl::NotFoundError(msg);
    return absl::InternalError(msg);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return absl::InternalError(path + ": fstat failed: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(path + ": not a regular file");
  const size_t size = static_cast<size_t>(st.st_size);
  std::unique_ptr<const uint8_t, Unmapper> mapping(nullptr, Unmapper{size});
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (p == MAP_FAILED) {
      return absl::InternalError(path + ": mmap of " + std::to_string(size) +
                                 " bytes failed: " + std::strerror(errno));
    }
    mapping.reset(static_cast<const uint8_t*>(p));
  }
  return std::unique_ptr<MappedFile>(new MappedFile(path, std::move(fd), std::move(mapping), size));
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  DUET_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped, MappedFile::Open(path));
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile(std::move(mapped)));
  DUET_RETURN_IF_ERROR(f->ParseHeader());
  return f;
}

absl::Status SafetensorsFile::ParseHeader() {
  const std::string& path = file_->path();
  const size_t size = file_->size();
  auto bad = [&](const std::string& msg) { return absl::InvalidArgumentError(path + ": " + msg); };
  if (size < 8) {
    return bad(absl::StrCat("file is ", size,
                            " bytes; a safetensors file starts with an 8-byte "
                            "header length (truncated?)"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file_->data()[i];  // little endian
  if (header_len > size - 8) {
    return bad(absl::StrCat("header length ", header_len, " runs past the end of the file (", size,
                            " bytes, so at most ", size - 8, " header bytes; truncated?)"));
  }
  if (header_len > kMaxHeaderBytes) {
    return bad(absl::StrCat("header length ", header_len, " exceeds the format's limit of ",
                            kMaxHeaderBytes, " bytes"));
  }
  const std::string text(reinterpret_cast<const char*>(file_->data()) + 8, header_len);
  DUET_ASSIGN_OR_RETURN(nlohmann::json header, ParseJson(text, path + ": header"));
  if (!header.is_object())
    return bad("header: expected a JSON object, got " + JsonTypeName(header));

  const size_t data_start = 8 + static_cast<size_t>(header_len);
  const size_t data_size = size - data_start;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return bad("header: __metadata__: expected an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return bad("header: __metadata__: value of '" + m.key() + "' is " +
                     JsonTypeName(m.value()) + "; expected a string");
        }
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "': ";
    if (!v.is_object()) return bad(where + "expected an object, got " + JsonTypeName(v));
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) return bad(where + "missing string field 'dtype'");
    absl::StatusOr<Dtype> dtype = ParseDtype(dt->get<std::string>());
    if (!dtype.ok()) return bad(where + std::string(dtype.status().message()));

    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) return bad(where + "missing array field 'shape'");
    Entry e;
    e.dtype = *dtype;
    uint64_t numel = 1;
    for (const nlohmann::json& d : *sh) {
      std::optional<int64_t> dim = JsonToInt(d);
      if (!dim || *dim < 0) {
        return bad(where + "shape " + sh->dump() + ": expected non-negative integers");
      }
      e.shape.push_back(*dim);
      if (MulOverflows(numel, static_cast<uint64_t>(*dim), &numel)) {
        return bad(where + "shape " + sh->dump() + " overflows");
      }
    }
    uint64_t nbytes = 0;
    if (MulOverflows(numel, DtypeSize(e.dtype), &nbytes)) {
      return bad(where + "shape " + sh->dump() + " overflows");
    }

    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2) {
      return bad(where + "missing field 'data_offsets' ([begin, end])");
    }
    std::optional<int64_t> b = JsonToInt((*off)[0]), en = JsonToInt((*off)[1]);
    if (!b || !en || *b < 0 || *en < 0) {
      return bad(where + "data_offsets " + off->dump() + ": expected non-negative integers");
    }
    const uint64_t begin = static_cast<uint64_t>(*b), end = static_cast<uint64_t>(*en);
    if (begin > end) {
      return bad(where + "data_offsets " + off->dump() + ": begin is after end");
    }
    if (end > data_size) {
      return bad(absl::StrCat(where, "data_offsets ", off->dump(),
                              " run past the end of the data section (", data_size,
                              " bytes; file truncated?)"));
    }
    if (end - begin != nbytes) {
      return bad(absl::StrCat(where, "data_offsets ", off->dump(), " span ", end - begin,
                              " bytes; expected ", nbytes, " for shape ", ShapeToString(e.shape),
                              " of ", DtypeName(e.dtype)));
    }
    e.begin = data_start + begin;
    e.end = data_start + end;
    entries_.emplace(name, std::move(e));
  }

  // Tensors must not overlap (the format also forbids holes; we tolerate them).
  std::vector<std::pair<size_t, const std::string*>> order;
  for (const auto& [name, e] : entries_) {
    if (e.end > e.begin) order.emplace_back(e.begin, &name);
  }
  std::sort(order.begin(), order.end());
  for (size_t i = 1; i < order.size(); ++i) {
    const Entry& prev = entries_.at(*order[i - 1].second);
    if (order[i].first < prev.end) {
      return bad("tensor '" + *order[i].second + "': data overlaps tensor '" +
                 *order[i - 1].second + "'");
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> SafetensorsFile::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const auto& [name, e] : entries_) names.push_back(name);
  return names;
}

absl::StatusOr<TensorView> SafetensorsFile::Get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return absl::NotFoundError(path() + ": no tensor '" + name + "'");
  const Entry& e = it->second;
  TensorView t;
  t.name = name;
  t.dtype = e.dtype;
  t.shape = e.shape;
  t.data = file_->data() + e.begin;
  t.nbytes = e.end - e.begin;
  t.file = path();
  return t;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsCheckpoint

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::OpenDir(
    const std::string& model_dir) {
  const std::string single = model_dir + "/model.safetensors";
  const std::string index = model_dir + "/model.safetensors.index.json";
  if (FileExists(single)) return OpenFile(single);
  if (FileExists(index)) return OpenIndex(index);
  return absl::NotFoundError(model_dir +
                             ": no weights: expected model.safetensors or "
                             "model.safetensors.index.json");
}

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::OpenFile(
    const std::string& path) {
  DUET_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, SafetensorsFile::Open(path));
  auto ckpt = std::make_unique<SafetensorsCheckpoint>();
  ckpt->source_ = path;
  for (const std::string& name : f->TensorNames()) ckpt->where_[name] = f.get();
  ckpt->files_.push_back(std::move(f));
  return ckpt;
}

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::OpenIndex(
    const std::string& index_path) {
  DUET_ASSIGN_OR_RETURN(nlohmann::json index, ReadJsonFile(index_path));
  auto bad = [&](const std::string& msg) {
    return absl::InvalidArgumentError(index_path + ": " + msg);
  };
  if (!index.is_object()) return bad("expected a JSON object, got " + JsonTypeName(index));
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) {
    return bad("missing field 'weight_map' (an object of tensor name -> shard file)");
  }
  const size_t slash = index_path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : index_path.substr(0, slash);

  auto ckpt = std::make_unique<SafetensorsCheckpoint>();
  ckpt->source_ = index_path;
  std::map<std::string, const SafetensorsFile*> shards;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string()) {
      return bad("weight_map: tensor '" + it.key() + "': expected a shard file name, got " +
                 JsonTypeName(it.value()));
    }
    const std::string shard = it.value().get<std::string>();
    if (shard.empty() || shard[0] == '/' || shard.find("..") != std::string::npos) {
      return bad("weight_map: tensor '" + it.key() + "': shard '" + shard +
                 "' must be a file name relative to the index's directory");
    }
    auto s = shards.find(shard);
    if (s == shards.end()) {
      absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(dir + "/" + shard);
      if (!f.ok()) {
        return Annotate(f.status(),
                        index_path + ": shard '" + shard + "' (for tensor '" + it.key() + "')");
      }
      s = shards.emplace(shard, f->get()).first;
      ckpt->files_.push_back(std::move(*f));
    }
    if (!s->second->Has(it.key())) {
      return bad("weight_map puts tensor '" + it.key() + "' in " + s->second->path() +
                 ", which does not contain it");
    }
    ckpt->where_[it.key()] = s->second;
  }
  return ckpt;
}

std::vector<std::string> SafetensorsCheckpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(where_.size());
  for (const auto& [name, f] : where_) names.push_back(name);
  return names;
}

absl::StatusOr<TensorView> SafetensorsCheckpoint::Get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    return absl::NotFoundError(source_ + ": missing tensor '" + name + "'");
  }
  return it->second->Get(name);
}

absl::StatusOr<TensorView> SafetensorsCheckpoint::GetWithShape(const std::string& name,
                                                               const std::vector<int64_t>& shape,
                                                               const std::string& what) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    return absl::NotFoundError(source_ + ": missing tensor '" + name + "' (expected shape " +
                               ShapeToString(shape) + what + ")");
  }
  DUET_ASSIGN_OR_RETURN(TensorView t, it->second->Get(name));
  if (t.shape != shape) {
    return absl::InvalidArgumentError(t.file + ": tensor '" + name + "' has shape " +
                                      ShapeToString(t.shape) + "; expected " +
                                      ShapeToString(shape) + what);
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Conversion

absl::Status ConvertToFloat(Dtype dtype, const uint8_t* src, size_t n, float* dst) {
  switch (dtype) {
    case Dtype::kF32:
      if (n > 0) std::memcpy(dst, src, n * sizeof(float));
      return absl::OkStatus();
    case Dtype::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = HalfToFloat(h);
      }
      return absl::OkStatus();
    case Dtype::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = Bf16ToFloat(h);
      }
      return absl::OkStatus();
    case Dtype::kF64:
      for (size_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, src + 8 * i, 8);
        dst[i] = static_cast<float>(d);
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(std::string("cannot convert dtype ") + DtypeName(dtype) +
                                        " to float32; expected F32, F16, BF16 or F64");
  }
}

absl::Status ConvertToFloat(const TensorView& t, float* dst) {
  absl::Status s = ConvertToFloat(t.dtype, t.data, static_cast<size_t>(t.NumElements()), dst);
  if (!s.ok()) return Annotate(s, t.file + ": tensor '" + t.name + "'");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ToFloatVector(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.NumElements()));
  DUET_RETURN_IF_ERROR(ConvertToFloat(t, out.data()));
  return out;
}

}  // namespace duet::model
