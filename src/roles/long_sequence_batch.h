// A synthetic rollout batch at the lengths of long-sequence RL (reasoning-style responses of
// thousands of tokens with a heavy tail cut at a maximum length), for measuring what padding
// costs DistQueue's transfers. The tasks' own samples are short (a few tokens), where the fixed
// per-sample index dominates both layouts; this batch is the setting the public report's
// "padding cut > 80% on long-sequence training" speaks of. Lengths are lognormal, capped; token
// ids and behaviour log-probs are random (their values do not change any byte count).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/roles/queue_sample.h"

namespace rlf {

// Lognormal lengths: median x exp(sigma x N(0, 1)), rounded, clamped to [1, max].
struct LengthDistribution {
  double median = 1;
  double sigma = 0;
  int max = 1;
  std::string describe() const;  // "lognormal(median 2048, sigma 1.00) capped at 20480"
};

struct LongSequenceShape {
  LengthDistribution prompt{256, 0.5, 2048};
  LengthDistribution response{2048, 1.0, 20480};
  int vocab_size = 32;  // token ids drawn uniformly from [0, vocab_size)
};

// Throws ConfigError naming the option prefix (e.g. "--long-response") on a median <= 0, a sigma
// < 0 or > 4, a max < 1, or vocab_size < 1.
void validate_long_sequence_shape(const LongSequenceShape& shape);

// Sample i (0 <= i < count) is a pure function of (seed, i): ids i, group index 0, version 0,
// reward 1, finished.
std::vector<QueueSample> long_sequence_batch(const LongSequenceShape& shape, int count,
                                             uint64_t seed);

}  // namespace rlf
