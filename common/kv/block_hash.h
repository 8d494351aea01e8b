// BlockHash: the identity of a full KV block in the prefix cache. A chain over the full blocks
// of a token sequence: key_0 = H(seed, tokens of block 0), key_i = H(key_{i-1}, tokens of block
// i), with H = XXH3-128. The seed covers everything that changes K/V besides the tokens (model
// and KV layout, RoPE settings; see ModelRunner::PrefixCacheSeed), so equal keys mean equal K/V
// of positions [0, (i + 1) * block_size). A hit still compares the stored token ids
// (BlockPool::AcquirePrefix), so a hash collision can never produce a false hit.
//
//   BlockHash seed = SeedFromText(runner.PrefixCacheIdentity(layout));
//   std::vector<BlockHash> chain = ChainHashes(seed, prompt, layout.block_size);
//   // chain.size() == prompt.size() / block_size (full blocks only)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"

namespace duet::kv {

struct BlockHash {
  uint64_t low = 0;
  uint64_t high = 0;

  bool operator==(const BlockHash&) const = default;
  auto operator<=>(const BlockHash&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine(std::move(h), b.low, b.high);
  }
  std::string ToHex() const;  // 32 hex digits, high first
};

// The chain's seed: XXH3-128 of `identity`.
BlockHash SeedFromText(std::string_view identity);
// The key of the block after `prev` holding `tokens` (one block's ids).
BlockHash NextBlockHash(const BlockHash& prev, absl::Span<const int32_t> tokens);
// The keys of every full block of `tokens`, in order; at most `max_blocks` (-1: all).
std::vector<BlockHash> ChainHashes(const BlockHash& seed, absl::Span<const int32_t> tokens,
                                   int block_size, int64_t max_blocks = -1);

}  // namespace duet::kv
