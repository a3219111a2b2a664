// Timing for benchmarks: bodies run interleaved (A B A B ...) after one warm-up each, and each
// reports the median of its repeats, so slow drift of the machine hits all sides alike.
#pragma once

#include <functional>
#include <vector>

namespace rlf {

double median(std::vector<double> values);
// Returns each body's median wall time in seconds.
std::vector<double> time_interleaved(const std::vector<std::function<void()>>& bodies, int repeats);

}  // namespace rlf
