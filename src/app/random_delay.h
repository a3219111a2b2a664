// `--random-delay-ms N` (tests): a seeded random sleep of 0..N ms before every generation and
// training phase, so tests can shake the timing of a multi-rank run and check that results do not
// depend on it. Each rank draws its own sequence from (seed, rank).
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

namespace rlf {

class RandomDelay {
 public:
  RandomDelay(int max_ms, uint64_t seed, int rank)
      : max_ms_(max_ms), state_(seed * 7919 + uint64_t(rank)) {}
  void operator()() {
    if (max_ms_ <= 0) return;
    // A 64-bit LCG (Knuth's MMIX constants): plenty for spreading sleeps.
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    std::this_thread::sleep_for(
        std::chrono::microseconds((state_ >> 33) % (uint64_t(max_ms_) * 1000)));
  }

 private:
  int max_ms_;
  uint64_t state_;
};

}  // namespace rlf
