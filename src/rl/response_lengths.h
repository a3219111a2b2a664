// Response-length statistics of a task's training samples: the shape of the long tail that
// rollouts must cope with (a few very long responses hold up a whole batch).
#pragma once

#include <cstdint>
#include <vector>

#include "src/rl/task.h"

namespace rlf {

struct LengthStats {
  // Percentiles by the nearest-rank rule: the smallest length L such that at least p of the
  // samples are no longer than L.
  double median = 0, p90 = 0, p99 = 0, max = 0, mean = 0;
  std::vector<int64_t> histogram;  // index = response length in tokens, value = sample count
};

// Over train samples 0 .. samples - 1; a response's length in tokens is its answer's characters
// plus one for <eos>. Throws std::invalid_argument when samples < 1.
LengthStats response_length_stats(const Task& task, int64_t samples);

}  // namespace rlf
