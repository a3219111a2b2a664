#include "src/app/bench_timing.h"

#include <algorithm>
#include <chrono>

namespace rlf {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<double> time_interleaved(const std::vector<std::function<void()>>& bodies,
                                     int repeats) {
  using Clock = std::chrono::steady_clock;
  std::vector<std::vector<double>> samples(bodies.size());
  for (const auto& body : bodies) body();
  for (int r = 0; r < repeats; ++r) {
    for (size_t i = 0; i < bodies.size(); ++i) {
      const auto start = Clock::now();
      bodies[i]();
      samples[i].push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
  std::vector<double> medians;
  for (auto& s : samples) medians.push_back(median(s));
  return medians;
}

}  // namespace rlf
