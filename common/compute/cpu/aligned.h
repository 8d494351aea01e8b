// 64-byte aligned float (and 16-bit) buffers for the CPU kernels (packed weights, activations,
// scratch).
//
//   AlignedFloats buf = AllocateAlignedFloats(1024);
//   buf.get()[0] = 1.f;  // freed when `buf` goes out of scope
//   AlignedHalfs bits = AllocateAlignedHalfs(1024);  // bf16 / f16 elements
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

namespace duet::compute::cpu {

inline constexpr size_t kCacheLineBytes = 64;

struct AlignedFree {
  void operator()(void* p) const noexcept { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float[], AlignedFree>;
using AlignedHalfs = std::unique_ptr<uint16_t[], AlignedFree>;

// Returns at least `count` floats (rounded up to a whole cache line), 64-byte aligned, or
// nullptr when the allocation fails. Contents unspecified.
inline float* AllocateAlignedRaw(int64_t count) {
  size_t bytes = static_cast<size_t>(count > 0 ? count : 1) * sizeof(float);
  bytes = (bytes + kCacheLineBytes - 1) / kCacheLineBytes * kCacheLineBytes;
  return static_cast<float*>(std::aligned_alloc(kCacheLineBytes, bytes));
}

inline AlignedFloats AllocateAlignedFloats(int64_t count) {
  return AlignedFloats(AllocateAlignedRaw(count));
}

// At least `count` uint16 (a whole cache line), 64-byte aligned, or nullptr on failure.
inline AlignedHalfs AllocateAlignedHalfs(int64_t count) {
  size_t bytes = static_cast<size_t>(count > 0 ? count : 1) * sizeof(uint16_t);
  bytes = (bytes + kCacheLineBytes - 1) / kCacheLineBytes * kCacheLineBytes;
  return AlignedHalfs(static_cast<uint16_t*>(std::aligned_alloc(kCacheLineBytes, bytes)));
}

}  // namespace duet::compute::cpu
