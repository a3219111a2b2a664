// The random choices of task samples. Every draw is a Philox word addressed by (seed, sample id,
// position), so a sample is a pure function of (seed, id) and can be rebuilt on any rank without
// replaying other samples.
#pragma once

#include <cstdint>

#include "kernels/rng.h"

namespace rlf {

// Uniform integer in [lo, hi] from the draw at `position` of sample `id`. Multiply-shift maps a
// 32-bit word to the range; its bias (< range / 2^32) is far below anything a task can notice.
inline int uniform_int(uint64_t seed, int64_t id, uint64_t position, int lo, int hi) {
  const uint64_t word = random_words(seed, uint64_t(id), position)[0];
  const uint64_t range = uint64_t(int64_t(hi) - lo + 1);
  return lo + int((word * range) >> 32);
}

inline char random_digit(uint64_t seed, int64_t id, uint64_t position, int lo = 0) {
  return char('0' + uniform_int(seed, id, position, lo, 9));
}

}  // namespace rlf
