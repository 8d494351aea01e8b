// The element codecs the CUDA KV kernels use (common/compute/cuda/kv_quant.h, host and device
// source) against the CPU backend's definition (cpu/kv_codec.h), compiled here by the host
// compiler: whole tokens quantized with the kernels' recipe (amax, scale, codes) equal
// EncodeKvToken's bytes for int8 and fp8 (both take the fp8 conversion from
// common/base/float8.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/base/float8.h"
#include "common/compute/cpu/kv_codec.h"
#include "common/compute/cuda/kv_quant.h"
#include "gtest/gtest.h"

namespace duet::compute::cuda {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// One token quantized per kv head the way the CUDA write kernel does: amax by max (any order),
// scale = KvQuantScale(amax, max code), each code from KvQuantize*.
std::vector<uint8_t> KernelRecipe(kv::KvDtype dtype, const std::vector<float>& x, int nkv, int d,
                                  std::vector<float>* scales) {
  std::vector<uint8_t> codes(x.size());
  scales->assign(nkv, 0.f);
  for (int h = 0; h < nkv; ++h) {
    float amax = 0.f;
    for (int i = d - 1; i >= 0; --i) amax = std::fmax(amax, std::fabs(x[h * d + i]));
    const bool int8 = dtype == kv::KvDtype::kInt8;
    const float scale = KvQuantScale(amax, int8 ? kKvInt8Max : kKvFp8Max);
    (*scales)[h] = scale;
    for (int i = 0; i < d; ++i) {
      const float v = x[h * d + i];
      codes[h * d + i] =
          int8 ? static_cast<uint8_t>(KvQuantizeInt8(v, scale)) : KvQuantizeFp8(v, scale);
    }
  }
  return codes;
}

TEST(CudaKvQuantTest, TokensQuantizeLikeEncodeKvToken) {
  std::mt19937 rng(5);
  for (kv::KvDtype dtype : {kv::KvDtype::kInt8, kv::KvDtype::kFp8E4M3}) {
    for (int d : {16, 64, 80, 128, 256}) {
      const int nkv = 3;
      for (int trial = 0; trial < 200; ++trial) {
        std::vector<float> x(nkv * d);
        // Magnitudes spread over many binades, so fp8 codes hit subnormals and ties.
        std::uniform_real_distribution<float> mant(-1.f, 1.f);
        std::uniform_int_distribution<int> expo(-30, 10);
        for (float& v : x) v = std::ldexp(mant(rng), expo(rng));
        if (trial % 7 == 0) std::fill(x.begin(), x.begin() + d, 0.f);  // an all-zero head
        if (trial % 11 == 0) x[d + 3] = 1e30f;                         // one huge value
        if (trial % 13 == 0) {
          for (int i = 0; i < d; ++i) x[2 * d + i] = static_cast<float>(i % 9) - 4.f;  // ties
        }
        std::vector<uint8_t> want(x.size());
        std::vector<float> want_scales(nkv);
        cpu::EncodeKvToken(dtype, x.data(), nkv, d, want.data(), want_scales.data());
        std::vector<float> got_scales;
        const std::vector<uint8_t> got = KernelRecipe(dtype, x, nkv, d, &got_scales);
        ASSERT_EQ(got, want) << kv::KvDtypeName(dtype) << " d " << d << " trial " << trial;
        for (int h = 0; h < nkv; ++h) {
          ASSERT_EQ(Bits(got_scales[h]), Bits(want_scales[h])) << "head " << h;
        }
        // Decoding: code * scale, as cpu::DecodeKvHead.
        std::vector<float> row(d);
        for (int h = 0; h < nkv; ++h) {
          cpu::DecodeKvHeadPortable(dtype, want.data() + h * d, want_scales[h], d, row.data());
          for (int i = 0; i < d; ++i) {
            const uint8_t c = got[h * d + i];
            const float v = dtype == kv::KvDtype::kInt8
                                ? static_cast<float>(static_cast<int8_t>(c)) * got_scales[h]
                                : Fp8E4M3ToFloat(c) * got_scales[h];
            ASSERT_EQ(Bits(v), Bits(row[i])) << "head " << h << " dim " << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace duet::compute::cuda
