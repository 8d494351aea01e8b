#include "common/kv/block_hash.h"

#include <algorithm>
#include <cstring>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_format.h"
#include "xxhash.h"

namespace duet::kv {

std::string BlockHash::ToHex() const { return absl::StrFormat("%016x%016x", high, low); }

BlockHash SeedFromText(std::string_view identity) {
  const XXH128_hash_t h = XXH3_128bits(identity.data(), identity.size());
  return BlockHash{.low = h.low64, .high = h.high64};
}

BlockHash NextBlockHash(const BlockHash& prev, absl::Span<const int32_t> tokens) {
  // The previous key is the first 16 bytes of the hashed input, so the key of block i depends on
  // every token before it and on the seed. Token ids are hashed as little-endian int32.
  absl::InlinedVector<uint8_t, 16 + 64 * sizeof(int32_t)> buf(16 + tokens.size() * sizeof(int32_t));
  std::memcpy(buf.data(), &prev.low, 8);
  std::memcpy(buf.data() + 8, &prev.high, 8);
  if (!tokens.empty()) std::memcpy(buf.data() + 16, tokens.data(), tokens.size() * sizeof(int32_t));
  const XXH128_hash_t h = XXH3_128bits(buf.data(), buf.size());
  return BlockHash{.low = h.low64, .high = h.high64};
}

std::vector<BlockHash> ChainHashes(const BlockHash& seed, absl::Span<const int32_t> tokens,
                                   int block_size, int64_t max_blocks) {
  std::vector<BlockHash> out;
  if (block_size <= 0) return out;
  int64_t n = static_cast<int64_t>(tokens.size()) / block_size;
  if (max_blocks >= 0) n = std::min(n, max_blocks);
  out.reserve(n);
  BlockHash prev = seed;
  for (int64_t i = 0; i < n; ++i) {
    prev = NextBlockHash(prev, tokens.subspan(i * block_size, block_size));
    out.push_back(prev);
  }
  return out;
}

}  // namespace duet::kv
