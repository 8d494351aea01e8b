// KvLayout: the geometry of a paged KV cache, shared by compute (where K/V live), the block pool
// (how much memory) and transfer (which bytes to move). The fingerprint identifies a layout
// across processes: prefill and decode peers must agree on it (docs/design.md invariant 6).
//
// Region layout (one contiguous region per process, `num_blocks` blocks per layer):
//   [layer][block][K|V][token in block][kv head][head dim]
// so the bytes of (layer l, block b) are one contiguous run of BlockBytes(), K first then V,
// and a run of consecutive block ids in one layer is one contiguous run of memory.
// Quantized dtypes (int8, fp8 e4m3) keep one f32 scale per (token, kv head), written with the
// token: each half of a block is [token][kv head][head dim] codes followed by [token][kv head]
// scales, so a block's data and scales stay one run that transfer moves as is (element =
// code * scale; docs/design.md §3.1).
//
//   KvLayout layout{.model_id = "tiny", .num_layers = 2, .num_kv_heads = 2, .head_dim = 16,
//                   .block_size = 16, .dtype = KvDtype::kF32};
//   DUET_RETURN_IF_ERROR(layout.Validate());
//   size_t off = layout.BlockOffset(/*layer=*/1, /*block=*/7, /*num_blocks=*/128);
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace duet::kv {

using BlockId = int32_t;

enum class KvDtype : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kInt8 = 3, kFp8E4M3 = 4 };

// Bytes of one element's code (the scales are extra, below).
size_t KvDtypeBytes(KvDtype dtype);
const char* KvDtypeName(KvDtype dtype);
// "f32", "f16", "bf16", "int8", "fp8" (also "float32", "float16", "bfloat16", "fp8_e4m3");
// others InvalidArgument naming the valid values. "auto" is not one: where it is allowed the
// option is a std::optional<KvDtype> (common/base/auto_option.h).
absl::StatusOr<KvDtype> ParseKvDtype(absl::string_view name);
// Whether the dtype stores a scale per (token, kv head) next to its codes.
bool KvDtypeHasScales(KvDtype dtype);
// Bytes of one scale (f32).
inline constexpr size_t kKvScaleBytes = 4;
// The scale scheme, part of the layout's identity: "none" or "f32/token/head".
const char* KvScaleSchemeName(KvDtype dtype);

struct KvLayout {
  std::string model_id;  // names the model whose K/V these are (part of the fingerprint)
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;  // tokens per block
  KvDtype dtype = KvDtype::kF32;

  absl::Status Validate() const;

  size_t dtype_bytes() const { return KvDtypeBytes(dtype); }
  bool has_scales() const { return KvDtypeHasScales(dtype); }
  // Elements of one token's K (or V) in one layer: kv_heads * head_dim.
  int64_t token_elems() const { return static_cast<int64_t>(num_kv_heads) * head_dim; }
  // Bytes of one token's K (or V) in one layer, scales included.
  size_t TokenHalfBytes() const {
    return static_cast<size_t>(token_elems()) * dtype_bytes() +
           (has_scales() ? static_cast<size_t>(num_kv_heads) * kKvScaleBytes : 0);
  }
  // Bytes of the codes of K (or V) of one block; its scales (if any) follow them.
  size_t HalfBlockDataBytes() const {
    return static_cast<size_t>(block_size) * token_elems() * dtype_bytes();
  }
  // Bytes of K (or V) of one block in one layer, scales included; V starts this far after K.
  size_t HalfBlockBytes() const { return static_cast<size_t>(block_size) * TokenHalfBytes(); }
  // Bytes of one block in one layer, K and V together.
  size_t BlockBytes() const { return 2 * HalfBlockBytes(); }
  // Byte offset of (layer, block) in a region holding `num_blocks` blocks per layer.
  size_t BlockOffset(int layer, BlockId block, int64_t num_blocks) const {
    return (static_cast<size_t>(layer) * static_cast<size_t>(num_blocks) +
            static_cast<size_t>(block)) * BlockBytes();
  }
  // Total region bytes for `num_blocks` blocks per layer.
  size_t RegionBytes(int64_t num_blocks) const {
    return static_cast<size_t>(num_layers) * static_cast<size_t>(num_blocks) * BlockBytes();
  }
  // M_KV = 2 * L * T * Hkv * (d * bytes + scale bytes): the KV bytes of `tokens` tokens across
  // all layers (KvBytesPerToken below is the same figure from the formula alone).
  size_t BytesForTokens(int64_t tokens) const {
    return 2 * static_cast<size_t>(num_layers) * static_cast<size_t>(tokens) * TokenHalfBytes();
  }
  int64_t BlocksForTokens(int64_t tokens) const { return (tokens + block_size - 1) / block_size; }

  // Stable 64-bit hash of every field above (FNV-1a over a canonical string).
  uint64_t Fingerprint() const;
  // "model=tiny layers=2 kv_heads=2 head_dim=16 block=16 dtype=f32 fp=0123abcd..." (with
  // " scales=f32/token/head" after the dtype for quantized dtypes).
  std::string Describe() const;

  bool operator==(const KvLayout& o) const = default;
};

// The formula 2 x L x Hkv x d x b per token, plus 2 x L x Hkv scales for quantized dtypes:
// what one token's K/V cost in a pool and on the wire. Agrees with KvLayout::BytesForTokens(1).
double KvBytesPerToken(int num_layers, int num_kv_heads, int head_dim, KvDtype dtype);

// Refuses a peer whose layout differs; the message names both sides.
absl::Status CheckLayoutsMatch(const KvLayout& local, const KvLayout& remote,
                               const std::string& local_name, const std::string& remote_name);

// A view of a KV region for kernels: where (layer, block)'s K and V are.
struct KvCacheView {
  KvLayout layout;
  void* base = nullptr;
  int64_t num_blocks = 0;

  uint8_t* BlockPtr(int layer, BlockId block) const {
    return static_cast<uint8_t*>(base) + layout.BlockOffset(layer, block, num_blocks);
  }
  // K of token `offset` in (layer, block): [kv_heads][head_dim].
  template <typename T>
  T* KeyPtr(int layer, BlockId block, int offset) const {
    return reinterpret_cast<T*>(BlockPtr(layer, block)) + offset * layout.token_elems();
  }
  template <typename T>
  T* ValuePtr(int layer, BlockId block, int offset) const {
    return reinterpret_cast<T*>(BlockPtr(layer, block) + layout.HalfBlockBytes()) +
           offset * layout.token_elems();
  }
  // Scales of token `offset`'s K (or V) in (layer, block): [kv_heads] floats (quantized dtypes).
  float* KeyScalePtr(int layer, BlockId block, int offset) const {
    return reinterpret_cast<float*>(BlockPtr(layer, block) + layout.HalfBlockDataBytes()) +
           offset * layout.num_kv_heads;
  }
  float* ValueScalePtr(int layer, BlockId block, int offset) const {
    return reinterpret_cast<float*>(BlockPtr(layer, block) + layout.HalfBlockBytes() +
                                    layout.HalfBlockDataBytes()) +
           offset * layout.num_kv_heads;
  }
};

}  // namespace duet::kv
