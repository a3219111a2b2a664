// Router statistics (tokens per expert per step) for the balancers. Synthetic: every token picks
// top_k distinct experts from a Zipf(s) popularity over a ranking of the experts, and the ranking
// drifts by random adjacent transpositions each step (a slow random walk of every expert's rank);
// seeded (Philox), the same options give the same trace on every machine. Recorded: a text file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
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
  // The experts of `tokens` tokens ([tokens, top_k], distinct per token) under the current
  // ranking, drawn from Philox stream `stream` (streams >= 2^32 never meet next_step's).
  std::vector<int> route(int tokens, uint64_t stream) const;

  const std::vector<int>& ranking() const { return expert_of_rank_; }

 private:
  DriftingZipfOptions options_;
  std::vector<double> cdf_;          // over ranks
  std::vector<int> expert_of_rank_;  // rank -> expert
  uint64_t step_ = 0;
};

// Recorded router statistics: a text file with one step per line, the tokens routed to each
// expert separated by commas (the same count of experts on every line); blank lines and lines
// starting with '#' are skipped. ConfigError naming the file and line for anything else, or for
// fewer than 2 steps.
std::vector<std::vector<double>> read_routing_trace(const std::string& path);

// The text read_routing_trace reads back exactly: `comment` as '#' lines (one per line of it),
// then one step per line (token counts printed exactly: they are whole numbers in practice).
std::string routing_trace_text(const std::vector<std::vector<double>>& steps,
                               const std::string& comment);

}  // namespace rlf
