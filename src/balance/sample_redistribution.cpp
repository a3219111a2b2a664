#include "src/balance/sample_redistribution.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "src/balance/data_reordering.h"
#include "src/balance/greedy_packing.h"

namespace rlf {

namespace {

double largest(const std::vector<double>& loads) {
  return loads.empty() ? 0.0 : *std::max_element(loads.begin(), loads.end());
}

// The rank each bin of `bins` goes to: bins and ranks paired greedily by the cost a rank already
// holds of the bin's samples, largest first (ties by bin, then rank), so that the samples that
// stay put carry as much of the step as the greedy pairing finds.
std::vector<int> match_bins_to_ranks(const std::vector<std::vector<int>>& bins,
                                     const std::vector<int>& source_of,
                                     const std::vector<double>& cost_of, int ranks) {
  struct Pair {
    double kept;
    int bin, rank;
  };
  std::vector<Pair> pairs;
  for (int b = 0; b < ranks; ++b) {
    std::vector<double> kept(size_t(ranks), 0.0);
    for (int i : bins[size_t(b)]) kept[size_t(source_of[size_t(i)])] += cost_of[size_t(i)];
    for (int r = 0; r < ranks; ++r) pairs.push_back({kept[size_t(r)], b, r});
  }
  std::sort(pairs.begin(), pairs.end(), [](const Pair& a, const Pair& b) {
    if (a.kept != b.kept) return a.kept > b.kept;
    return a.bin != b.bin ? a.bin < b.bin : a.rank < b.rank;
  });
  std::vector<int> rank_of_bin(size_t(ranks), -1);
  std::vector<bool> taken(size_t(ranks), false);
  for (const Pair& p : pairs) {
    if (rank_of_bin[size_t(p.bin)] >= 0 || taken[size_t(p.rank)]) continue;
    rank_of_bin[size_t(p.bin)] = p.rank;
    taken[size_t(p.rank)] = true;
  }
  return rank_of_bin;
}

// Costliest first (ties by position), each sample stays on its source rank while that rank's load
// stays within `target` (the greedy plan's slowest rank), else goes to the least-loaded rank
// (ties by rank): often as fast as the greedy plan with far fewer samples moved.
std::vector<int> stay_first(const std::vector<double>& costs, const std::vector<int>& source_of,
                            int ranks, double target) {
  std::vector<int> order(costs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return costs[size_t(a)] > costs[size_t(b)]; });
  std::vector<double> load(size_t(ranks), 0.0);
  std::vector<int> rank_of(costs.size());
  for (int i : order) {
    int to = source_of[size_t(i)];
    if (load[size_t(to)] + costs[size_t(i)] > target)
      to = int(std::min_element(load.begin(), load.end()) - load.begin());
    rank_of[size_t(i)] = to;
    load[size_t(to)] += costs[size_t(i)];
  }
  return rank_of;
}

int moves(const std::vector<int>& rank_of, const std::vector<int>& source_of) {
  int moved = 0;
  for (size_t i = 0; i < rank_of.size(); ++i) moved += rank_of[i] != source_of[i];
  return moved;
}

}  // namespace

double RedistributionPlan::in_order_slowest() const {
  return largest(in_order_load);
}

double RedistributionPlan::slowest() const {
  return largest(load);
}

RedistributionPlan plan_redistribution(const std::vector<int64_t>& sample_ids,
                                       const std::vector<int>& source_rank,
                                       const std::vector<double>& costs, int ranks) {
  const size_t n = sample_ids.size();
  if (source_rank.size() != n || costs.size() != n) {
    throw std::invalid_argument("plan_redistribution: " + std::to_string(n) + " ids, " +
                                std::to_string(source_rank.size()) + " ranks and " +
                                std::to_string(costs.size()) + " costs");
  }
  if (ranks < 1) throw std::invalid_argument("plan_redistribution: ranks must be >= 1");
  for (int r : source_rank) {
    if (r < 0 || r >= ranks) {
      throw std::invalid_argument("plan_redistribution: source rank " + std::to_string(r) +
                                  " outside [0, " + std::to_string(ranks) + ")");
    }
  }
  // Canonical order: the plan must not depend on which rank held which sample first.
  std::vector<int> canonical(n);
  std::iota(canonical.begin(), canonical.end(), 0);
  std::sort(canonical.begin(), canonical.end(),
            [&](int a, int b) { return sample_ids[size_t(a)] < sample_ids[size_t(b)]; });
  for (size_t p = 1; p < n; ++p) {
    if (sample_ids[size_t(canonical[p])] == sample_ids[size_t(canonical[p - 1])]) {
      throw std::invalid_argument("plan_redistribution: sample id " +
                                  std::to_string(sample_ids[size_t(canonical[p])]) +
                                  " appears twice");
    }
  }
  std::vector<double> canonical_costs(n);
  std::vector<int> canonical_source(n);
  for (size_t p = 0; p < n; ++p) {
    canonical_costs[p] = costs[size_t(canonical[p])];
    canonical_source[p] = source_rank[size_t(canonical[p])];
  }
  const RankAssignment greedy = assign_samples_to_ranks(canonical_costs, ranks);
  const std::vector<int> rank_of_bin =
      match_bins_to_ranks(greedy.samples, canonical_source, canonical_costs, ranks);
  std::vector<int> matched(n);
  for (int b = 0; b < ranks; ++b) {
    for (int p : greedy.samples[size_t(b)]) matched[size_t(p)] = rank_of_bin[size_t(b)];
  }
  const std::vector<int> staying =
      stay_first(canonical_costs, canonical_source, ranks, largest(greedy.load));
  const std::vector<double> matched_load = bin_loads(canonical_costs, matched, ranks);
  const std::vector<double> staying_load = bin_loads(canonical_costs, staying, ranks);
  const bool stay = largest(staying_load) <= largest(matched_load) &&
                    moves(staying, canonical_source) <= moves(matched, canonical_source);
  const std::vector<int>& chosen = stay ? staying : matched;

  RedistributionPlan plan;
  plan.in_order_load.assign(size_t(ranks), 0.0);
  for (size_t i = 0; i < n; ++i) plan.in_order_load[size_t(source_rank[i])] += costs[i];
  plan.lower_bound = assignment_lower_bound(costs, ranks);
  plan.load = stay ? staying_load : matched_load;
  plan.reordered = plan.slowest() < plan.in_order_slowest();
  plan.destination = source_rank;
  if (plan.reordered) {
    for (size_t p = 0; p < n; ++p) plan.destination[size_t(canonical[p])] = chosen[p];
  } else {
    plan.load = plan.in_order_load;
  }
  plan.trained.assign(size_t(ranks), {});
  for (int i : canonical) plan.trained[size_t(plan.destination[size_t(i)])].push_back(i);
  for (size_t i = 0; i < n; ++i) plan.moved += plan.destination[i] != source_rank[i];
  return plan;
}

}  // namespace rlf
