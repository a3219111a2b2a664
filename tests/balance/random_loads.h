// Random expert loads for the placement tests: Zipf popularity over a shuffled ranking.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace rlf::test {

// 1000 x rank^-s for experts in a random order (s = 0: uniform).
inline std::vector<double> zipf_loads(int experts, double s, std::mt19937_64& g) {
  std::vector<double> w(static_cast<size_t>(experts));
  for (int e = 0; e < experts; ++e) w[size_t(e)] = 1000 * std::pow(e + 1.0, -s);
  std::shuffle(w.begin(), w.end(), g);
  return w;
}

}  // namespace rlf::test
