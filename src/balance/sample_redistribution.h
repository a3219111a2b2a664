// Planning one step's data reordering across data-parallel ranks: every rank knows every sample
// of the step (id, the rank holding it, its predicted cost), and every rank computes the same
// plan from that — the greedy assignment (data_reordering.h) in canonical sample-id order, its
// bins matched to the ranks that already hold most of their cost; or, when it is as fast and moves
// fewer samples, the same greedy pass letting each sample stay on its rank while that rank stays
// within the greedy plan's slowest load. A plan is kept only when it predicts a faster slowest
// rank than leaving the samples where they are.
// A pure function of its inputs, so ranks agree without further messages.
#pragma once

#include <cstdint>
#include <vector>

namespace rlf {

struct RedistributionPlan {
  std::vector<int> destination;           // per input sample: the rank that trains it
  std::vector<std::vector<int>> trained;  // per rank: input indices it trains, by sample id
  std::vector<double> in_order_load;      // per rank: predicted cost of what it holds now
  std::vector<double> load;               // per rank: predicted cost of what it trains
  double lower_bound = 0;                 // max(mean load, largest single cost)
  int moved = 0;                          // samples whose destination is not their source
  bool reordered = false;  // false: the assignment did not beat the current one; nothing moves

  double in_order_slowest() const;
  double slowest() const;
};

// sample_ids (unique), source_rank (in [0, ranks)) and costs (finite, >= 0) hold one entry per
// sample of the step, in any order. std::invalid_argument on sizes that differ, a duplicate id
// or a rank out of range; ConfigError (from the assignment) on a bad cost.
RedistributionPlan plan_redistribution(const std::vector<int64_t>& sample_ids,
                                       const std::vector<int>& source_rank,
                                       const std::vector<double>& costs, int ranks);

}  // namespace rlf
