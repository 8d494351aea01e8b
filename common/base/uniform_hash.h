// Counter-based uniform random numbers shared by the host and the CUDA kernels, so synthetic
// weights are bit-identical wherever they are generated, and so is sampling's per-step draw:
//
//   float w = duet::compute::UniformFromHash(/*seed=*/7, /*index=*/i, /*scale=*/0.02f);
//   double u = duet::compute::SamplingUniform(/*seed=*/1, /*step=*/0);  // in [0, 1)
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DUET_HOST_DEVICE __host__ __device__
#else
#define DUET_HOST_DEVICE
#endif

namespace duet::compute {

DUET_HOST_DEVICE inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [-scale, scale): 24 random bits make u exactly k / 2^24, so 2u - 1 is exact and
// the only rounding is the final multiply (identical on host and device).
DUET_HOST_DEVICE inline float UniformFromHash(uint64_t seed, uint64_t index, float scale) {
  const uint64_t h = SplitMix64(SplitMix64(seed) ^ (index * 0xD6E8FEB86659FD93ull));
  const float u = static_cast<float>(static_cast<uint32_t>(h >> 40)) * (1.0f / 16777216.0f);
  const float centred = 2.0f * u - 1.0f;
  return centred * scale;
}

// Sampling's draw for output token `step` (sampling.h): uniform in [0, 1) with 53 random bits
// from (seed, step). Integer hashing and one exact scaling: the same double on host and device.
DUET_HOST_DEVICE inline double SamplingUniform(uint64_t seed, int64_t step) {
  const uint64_t r = SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(step));
  return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace duet::compute
