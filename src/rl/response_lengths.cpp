#include "src/rl/response_lengths.h"

#include <cmath>
#include <stdexcept>

namespace rlf {

namespace {

double nearest_rank(const std::vector<int64_t>& histogram, int64_t samples, double p) {
  const auto rank = std::max<int64_t>(1, int64_t(std::ceil(p * double(samples))));
  int64_t seen = 0;
  for (size_t length = 0; length < histogram.size(); ++length) {
    seen += histogram[length];
    if (seen >= rank) return double(length);
  }
  return double(histogram.size()) - 1;
}

}  // namespace

LengthStats response_length_stats(const Task& task, int64_t samples) {
  if (samples < 1) {
    throw std::invalid_argument("response_length_stats: samples must be >= 1, got " +
                                std::to_string(samples));
  }
  LengthStats stats;
  double total = 0;
  for (int64_t index = 0; index < samples; ++index) {
    const size_t length = task.train_sample(index).answer.size() + 1;  // + <eos>
    if (length >= stats.histogram.size()) stats.histogram.resize(length + 1, 0);
    ++stats.histogram[length];
    total += double(length);
  }
  stats.mean = total / double(samples);
  stats.median = nearest_rank(stats.histogram, samples, 0.5);
  stats.p90 = nearest_rank(stats.histogram, samples, 0.9);
  stats.p99 = nearest_rank(stats.histogram, samples, 0.99);
  stats.max = double(stats.histogram.size()) - 1;
  return stats;
}

}  // namespace rlf
