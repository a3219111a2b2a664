#include "kernels/rng.h"

#include <cmath>

namespace rlf {

double philox_normal(uint64_t seed, uint64_t stream, uint64_t position) {
  const auto words = random_words(seed, stream, position);
  // 53-bit uniforms in (0, 1]; u1 > 0 keeps the log finite.
  const uint64_t bits1 = (uint64_t(words[0]) << 21) ^ (uint64_t(words[1]) >> 11);
  const uint64_t bits2 = (uint64_t(words[2]) << 21) ^ (uint64_t(words[3]) >> 11);
  const double u1 = (double(bits1 & ((1ull << 53) - 1)) + 1.0) / 9007199254740992.0;
  const double u2 = double(bits2 & ((1ull << 53) - 1)) / 9007199254740992.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace rlf
