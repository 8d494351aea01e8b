// A minimal GGUF writer for tests (and fuzz seeds): metadata of any type and raw tensors,
// with knobs to write malformed files (any version, dims, type or offset).
//
//   GgufWriter w;
//   w.AddString("general.architecture", "llama");
//   w.AddTensor("t", {4, 2}, /*F32=*/0, FloatBytes({1, 2, 3, 4, 5, 6, 7, 8}));
//   WriteRaw(path, w.Bytes());
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace duet::model::testing {

class GgufWriter {
 public:
  uint32_t version = 3;
  uint64_t alignment = 32;  // data section alignment (general.alignment is not written for it)

  template <typename T>
  static std::string Pod(T v) {
    std::string s(sizeof(T), '\0');
    std::memcpy(s.data(), &v, sizeof(T));
    return s;
  }
  static std::string Str(const std::string& s) { return Pod<uint64_t>(s.size()) + s; }

  // A key with a raw value (type number + the bytes that follow it).
  void AddRaw(const std::string& key, uint32_t type, const std::string& value_bytes) {
    kv_ += Str(key) + Pod(type) + value_bytes;
    ++n_kv_;
  }
  void AddU32(const std::string& key, uint32_t v) { AddRaw(key, 4, Pod(v)); }
  void AddI32(const std::string& key, int32_t v) { AddRaw(key, 5, Pod(v)); }
  void AddF32(const std::string& key, float v) { AddRaw(key, 6, Pod(v)); }
  void AddBool(const std::string& key, bool v) { AddRaw(key, 7, Pod<uint8_t>(v)); }
  void AddString(const std::string& key, const std::string& v) { AddRaw(key, 8, Str(v)); }
  void AddU64(const std::string& key, uint64_t v) { AddRaw(key, 10, Pod(v)); }
  void AddStringArray(const std::string& key, const std::vector<std::string>& v) {
    std::string b = Pod<uint32_t>(8) + Pod<uint64_t>(v.size());
    for (const std::string& s : v) b += Str(s);
    AddRaw(key, 9, b);
  }
  void AddI32Array(const std::string& key, const std::vector<int32_t>& v) {
    std::string b = Pod<uint32_t>(5) + Pod<uint64_t>(v.size());
    for (int32_t x : v) b += Pod(x);
    AddRaw(key, 9, b);
  }

  // A tensor; offset -1 places it after the previous one (aligned).
  void AddTensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type,
                 const std::string& data, int64_t offset = -1) {
    uint64_t off = offset >= 0 ? static_cast<uint64_t>(offset) : next_offset_;
    infos_ += Str(name) + Pod<uint32_t>(dims.size());
    for (uint64_t d : dims) infos_ += Pod(d);
    infos_ += Pod(type) + Pod(off);
    if (data_.size() < off + data.size()) data_.resize(off + data.size(), '\0');
    data_.replace(off, data.size(), data);
    next_offset_ = (off + data.size() + alignment - 1) / alignment * alignment;
    ++n_tensors_;
  }

  // Overrides the counts written in the header (to write lying headers).
  void SetCounts(uint64_t n_tensors, uint64_t n_kv) {
    n_tensors_override_ = n_tensors;
    n_kv_override_ = n_kv;
    counts_overridden_ = true;
  }

  std::string Bytes() const {
    std::string out = "GGUF" + Pod(version) +
                      Pod<uint64_t>(counts_overridden_ ? n_tensors_override_ : n_tensors_) +
                      Pod<uint64_t>(counts_overridden_ ? n_kv_override_ : n_kv_) + kv_ + infos_;
    out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
    return out + data_;
  }

 private:
  std::string kv_, infos_, data_;
  uint64_t n_kv_ = 0, n_tensors_ = 0, next_offset_ = 0;
  uint64_t n_tensors_override_ = 0, n_kv_override_ = 0;
  bool counts_overridden_ = false;
};

inline std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

}  // namespace duet::model::testing
