// Synthetic router statistics: tokens per expert per step when every token picks top_k distinct
// experts from a Zipf(s) popularity over a ranking of the experts, and the ranking drifts by
// random adjacent transpositions each step (a slow random walk of every expert's rank). Seeded
// (Philox): the same options give the same trace on every machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rlf {

struct DriftingZipfOptions {
  int experts = 64, tokens = 16384, top_k = 8;
  double zipf = 1.2;    // popularity of the expert of rank r (1-based): r^-zipf
  int drift_swaps = 4;  // adjacent rank transpositions per step
  uint64_t seed = 1;

  void validate() const;  // ConfigError naming the option
};

class DriftingZipfRouter {
 public:
  explicit DriftingZipfRouter(DriftingZipfOptions options);

  // Routes one step's tokens, then drifts the ranking. Returns tokens per expert.
  std::vector<double> next_step();

  const std::vector<int>& ranking() const { return expert_of_rank_; }

 private:
  DriftingZipfOptions options_;
  std::vector<double> cdf_;          // over ranks
  std::vector<int> expert_of_rank_;  // rank -> expert
  uint64_t step_ = 0;
};

}  // namespace rlf
