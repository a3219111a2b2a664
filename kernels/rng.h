// Counter-based random numbers (Philox-4x32-10, Salmon et al. SC'11): a pure function of
// (key, counter), so any rank can draw the number for any (seed, sample, position) directly.
#pragma once

#include <array>
#include <cstdint>

namespace rlf {

inline std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter,
                                          std::array<uint32_t, 2> key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kMul0) * counter[0];
    const uint64_t p1 = uint64_t(kMul1) * counter[2];
    counter = {uint32_t(p1 >> 32) ^ counter[1] ^ key[0], uint32_t(p1),
               uint32_t(p0 >> 32) ^ counter[3] ^ key[1], uint32_t(p0)};
    key[0] += kWeyl0;
    key[1] += kWeyl1;
  }
  return counter;
}

// Four independent 32-bit words for (seed, stream, position); `stream` is a sample id or any
// other 64-bit name of a random stream.
inline std::array<uint32_t, 4> random_words(uint64_t seed, uint64_t stream, uint64_t position) {
  return philox4x32(
      {uint32_t(position), uint32_t(position >> 32), uint32_t(stream), uint32_t(stream >> 32)},
      {uint32_t(seed), uint32_t(seed >> 32)});
}

// Uniform in [0, 1) with 24 random bits (exactly representable in float).
inline float philox_uniform(uint64_t seed, uint64_t stream, uint64_t position) {
  return float(random_words(seed, stream, position)[0] >> 8) * (1.0f / 16777216.0f);
}

// Standard normal by Box-Muller from two words; for parameter initialization.
double philox_normal(uint64_t seed, uint64_t stream, uint64_t position);

}  // namespace rlf
