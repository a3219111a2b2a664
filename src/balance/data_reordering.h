// Data reordering across data-parallel ranks: a per-sample cost model linear in (1, length,
// length^2) fitted by least squares from measured times, and a greedy assignment of the global
// batch to ranks (costliest sample first, to the least-loaded rank) that minimizes the slowest
// rank. The global batch is unchanged (every sample on exactly one rank); only who runs what moves.
#pragma once

#include <optional>
#include <vector>

namespace rlf {

struct SampleCostModel {
  double fixed = 0, per_token = 0, per_token_squared = 0;  // seconds, s/token, s/token^2

  double cost(double length) const {
    return fixed + per_token * length + per_token_squared * length * length;
  }
};

// A measured batch of samples (one rank's share of a step): how many samples, the sum of their
// lengths and of their squared lengths, and its seconds. A batch costs the sum of its samples'
// costs, so batches fit the per-sample model as well as single samples do.
struct BatchCostObservation {
  double samples = 0, tokens = 0, squared_tokens = 0, seconds = 0;
};

// Least squares of seconds against (samples, tokens, squared tokens) (Eigen, column-pivoting QR,
// columns scaled to comparable magnitudes). nullopt when the observations do not determine the
// three coefficients (numerical rank < 3); ConfigError when a value is not finite.
std::optional<SampleCostModel> fit_batch_cost_model(
    const std::vector<BatchCostObservation>& observations);

// Least squares over (length, seconds) pairs (Eigen, column-pivoting QR). ConfigError when the
// sizes differ, a value is not finite, or fewer than 3 distinct lengths make the fit singular.
SampleCostModel fit_sample_cost_model(const std::vector<double>& lengths,
                                      const std::vector<double>& seconds);

struct RankAssignment {
  std::vector<std::vector<int>> samples;  // per rank: indices into the batch
  std::vector<double> load;               // per rank: summed cost
};

// Greedy longest-first (Graham's LPT). Proven: the slowest rank is at most mean + (1 - 1/ranks)
// x the cost of the last sample it received, so at most mean + max cost. ConfigError when
// ranks < 1 or a cost is negative or not finite.
RankAssignment assign_samples_to_ranks(const std::vector<double>& costs, int ranks);

// The unchanged-order baseline: consecutive blocks of the batch, as a plain data loader splits it.
RankAssignment assign_samples_in_order(const std::vector<double>& costs, int ranks);

// No assignment beats max(mean rank load, largest single cost).
double assignment_lower_bound(const std::vector<double>& costs, int ranks);

}  // namespace rlf
