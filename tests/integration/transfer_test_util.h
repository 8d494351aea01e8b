// Shared by the two-process transfer tests and their helper binary (transfer_test_peer):
// deterministic block contents, the file-based address exchange, and the request plan.
//
//   FillBlock(p, bytes, seed, request, layer, index);   // sender
//   EXPECT_TRUE(BlockMatches(p, bytes, seed, request, layer, index));   // receiver
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/kv/kv_layout.h"

namespace duet::transfer::testing {

inline uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

// Never all-zero, so a block that was not written never matches.
inline void FillBlock(uint8_t* p, size_t bytes, uint64_t seed, uint64_t request, int layer,
                      size_t index) {
  uint64_t s = Mix(seed ^ Mix(request * 1315423911ULL + layer * 2654435761ULL + index)) | 1;
  for (size_t off = 0; off + 8 <= bytes; off += 8) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    std::memcpy(p + off, &s, 8);
  }
}

inline bool BlockMatches(const uint8_t* p, size_t bytes, uint64_t seed, uint64_t request, int layer,
                         size_t index) {
  std::vector<uint8_t> want(bytes);
  FillBlock(want.data(), bytes, seed, request, layer, index);
  return std::memcmp(p, want.data(), bytes) == 0;
}

// Writes `contents` to `path` atomically (tmp + rename).
inline bool WriteFileAtomic(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

// Waits for `path` to exist, then returns its contents.
inline absl::StatusOr<std::string> WaitForFile(const std::string& path, absl::Time deadline) {
  struct stat st;
  while (::stat(path.c_str(), &st) != 0) {
    if (absl::Now() >= deadline) return absl::DeadlineExceededError(absl::StrCat("no file ", path));
    absl::SleepFor(absl::Milliseconds(1));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

struct PlannedRequest {
  uint64_t id = 0;
  std::vector<kv::BlockId> remote_blocks;
};

inline std::string EncodePlan(const std::vector<PlannedRequest>& plan) {
  std::string out = absl::StrCat(plan.size(), "\n");
  for (const PlannedRequest& r : plan) {
    absl::StrAppend(&out, r.id, " ", r.remote_blocks.size());
    for (kv::BlockId b : r.remote_blocks) absl::StrAppend(&out, " ", b);
    out += "\n";
  }
  return out;
}

inline std::vector<PlannedRequest> DecodePlan(const std::string& text) {
  std::istringstream in(text);
  size_t n = 0;
  in >> n;
  std::vector<PlannedRequest> plan(n);
  for (PlannedRequest& r : plan) {
    size_t count = 0;
    in >> r.id >> count;
    r.remote_blocks.resize(count);
    for (kv::BlockId& b : r.remote_blocks) in >> b;
  }
  return plan;
}

}  // namespace duet::transfer::testing
