#include "common/base/stream_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace duet {
namespace {

// Every length (around the streaming threshold and the 128-byte loop) and every alignment of
// source and destination copies exactly those bytes and touches nothing around them.
TEST(StreamingCopy, CopiesExactlyTheBytesAtAnyAlignmentAndLength) {
  std::mt19937 rng(7);
  std::vector<uint8_t> src(300 << 10), dst(300 << 10), want(300 << 10);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  const size_t lengths[] = {0, 1, 31, 32, 127, 128, 129, (16 << 10) - 1, 16 << 10,
                            (16 << 10) + 1, (16 << 10) + 97, 100000, 256 << 10};
  for (size_t n : lengths) {
    for (size_t so : {0, 1, 17, 32}) {
      for (size_t d_off : {0, 3, 31, 64}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        want = dst;
        std::memcpy(want.data() + d_off, src.data() + so, n);
        StreamingCopy(dst.data() + d_off, src.data() + so, n);
        ASSERT_EQ(dst, want) << "n=" << n << " src+" << so << " dst+" << d_off;
      }
    }
  }
}

}  // namespace
}  // namespace duet
