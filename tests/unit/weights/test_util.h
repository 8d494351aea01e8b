// Helpers for the tests that read and write model files: scratch directories, raw file writing,
// safetensors header bytes, heap in use.
#pragma once

#include <gtest/gtest.h>
#include <malloc.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace duet::model::testing {

// A fresh directory under $TMPDIR, removed by the destructor.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/duet_model_files_XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string ReadRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// 8-byte little-endian length + header text.
inline std::string HeaderBytes(const std::string& json, uint64_t declared_len) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((declared_len >> (8 * i)) & 0xff);
  return out + json;
}
inline std::string HeaderBytes(const std::string& json) { return HeaderBytes(json, json.size()); }

// Bytes of heap in use (glibc): small chunks plus chunks mapped on their own. The difference
// around a call is what the call left allocated.
inline size_t HeapBytesInUse() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

}  // namespace duet::model::testing
