#include "common/base/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace duet {

void StreamingCopy(void* dst, const void* src, size_t n) {
#if defined(__AVX2__)
  // Below a few pages the line-fill cost is small and memcpy's cached stores win.
  constexpr size_t kMinStreamingBytes = 16 << 10;
  if (n >= kMinStreamingBytes) {
    auto* d = static_cast<uint8_t*>(dst);
    const auto* s = static_cast<const uint8_t*>(src);
    const size_t head = (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31;  // align stores
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
      const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
    }
    std::memcpy(d + i, s + i, n - i);
    _mm_sfence();
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace duet
