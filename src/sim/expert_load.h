// The routed rows the busiest rank of an expert-parallel group computes in one exchange. Every MoE
// layer's dispatch and combine is a synchronization of the group: the rank that received the most
// (token, slot) assignments runs its expert FFN longest and the others wait for it, so a step pays
// the busiest rank's rows at every exchange, not the mean's. Even a router that spreads its
// choices uniformly over the experts gives the ranks multinomial loads, whose maximum exceeds the
// mean by a margin that shrinks relative to the mean as the exchange's tokens grow.
#pragma once

#include <vector>

namespace rlf::sim {

// E[max of n independent standard normal variables] (0 for n = 1): a deterministic quadrature,
// tabulated once for n <= 1024.
double expected_max_of_normals(int n);

// Expected rows of the busiest of `ranks` EP ranks when each of the group's `tokens` tokens picks
// `top_k` distinct experts of `experts`, every expert equally likely (experts spread evenly over
// the ranks, E / ranks each). One token puts a hypergeometric count on a rank (variance
// k (1/P)(1 - 1/P)(E - k)/(E - 1)); the ranks' summed counts have the covariance of
// Z_i - mean(Z) for independent Z_i of variance m (E - k)/(E - 1), m = tokens k / P the mean
// rows, so by the normal approximation the busiest rank's expected rows are
//   m + expected_max_of_normals(P) sqrt(m (E - k) / (E - 1)).
// (Two ranks, E 4, k 2, 100 tokens: 100 + 0.564 x 8.16 = 104.607 rows, the exact expectation
// 104.595; the excess over the mean is within 0.3% of the exact one there, 3.4% at 8 tokens, 38%
// at one token.) Exact for P = 1 and for k = E (every token on every expert).
//
// `max_over_mean` is the router's concentration: the busiest expert's tokens over the mean
// expert's (`rlfusion report`'s max/mean, the RL job's `router_max_over_mean`; 1 for a uniform
// router). The rank holding the hottest expert then gets that expert's rows and, of the others,
// the mean of the rest: hottest_rank_load_factor times the mean rank's rows. The busiest rank's
// expected rows are the larger of that and the uniform router's above: the spread decides while
// the ranks' means are close, the hottest rank's mean once it stands above the spread (two ranks,
// one expert or two each, top-1, 100 tokens: within 1.6% of the exact expectation for c in [1, 2],
// tests/sim/test_expert_load.cpp).
double busiest_rank_rows(double tokens, double top_k, double experts, int ranks,
                         double max_over_mean = 1);

// The mean rows of the rank holding the hottest expert over the mean rank's, with the experts in
// contiguous blocks of E / P (the runtime's placement, no rebalancing): the hottest expert at
// c = max_over_mean times the mean expert's load, the other E - 1 sharing the rest evenly, so
//   P (c + (E / P - 1) (E - c) / (E - 1)) / E.
// 1 at c = 1 or P = 1; c when every rank holds one expert (P = E).
double hottest_rank_load_factor(double max_over_mean, double experts, int ranks);

// The busiest rank's expected rows as busiest_rank_rows, with the hottest rank's mean rows given
// as `load_factor` times the mean rank's (hottest_rank_load_factor for the contiguous blocks,
// rebalanced_rank_load_factor after EDPB's placement).
double busiest_rank_rows_at_load_factor(double tokens, double top_k, double experts, int ranks,
                                        double load_factor);

// The router's per-expert loads as EDPB's placement sees them, hottest first, mean 1: the hottest
// at `max_over_mean`, the others decaying geometrically (the ratio fixed by the mean; all 1 for a
// uniform router). One number cannot say how the other experts share, and a placement decides
// what to pair with the hottest by that: with the rest even ("hottest + even", the contiguous
// blocks' model above) moving experts could gain nothing, which `bench rebalance` contradicts
// (busiest EP rank 1.873 -> 1.196 of the mean with no spare slot). Routing traces decay about
// geometrically: `small` on the sort prompts at concentration 6.5 had per-step loads such as 331,
// 151, 138, 48, 46, 16, 8, 7, 2, 2, 1, 0, 0, 0, 0, 0 (ratio 0.59 fitted: 0.41, 0.24, 0.14 of the
// tokens for the first three against 0.44, 0.20, 0.18 counted).
std::vector<double> geometric_router_loads(double max_over_mean, int experts);

// The same for a training EP group rebalanced by EDPB (`train --rebalance-every`, with
// `--redundant-experts R` or without): each of the `ranks` devices has E / ranks + `spare_slots`
// slots, and the runtime's placement (place_two_level, src/balance/expert_placement.h: hot experts
// replicated into the spare slots, the replicas packed heaviest first, one copy per device) is
// run on the router's loads as geometric_router_loads gives them. Returns the busiest device's
// load over the mean device's: 1 for a uniform router. With no spare slot the experts only move
// (`--rebalance-every` without `--redundant-experts`): the placement pairs the hot experts with
// cold ones.
double rebalanced_rank_load_factor(double max_over_mean, int experts, int ranks, int spare_slots);

// Experts the busiest of the `ranks` devices receives (per MoE layer) when EDPB's first decision
// replaces the contiguous blocks (round_robin_placement) by its placement of the router's
// geometric loads (as rebalanced_rank_load_factor places them), renumbered to move as little as
// possible (align_to), the transfers as the runtime makes them (transfers_between). The loads sit
// in expert order, so the blocks start with the hottest experts together: the blocks' worst case.
// 0 for a uniform router (no placement gains anything, so the runtime moves nothing).
int first_placement_received(double max_over_mean, int experts, int ranks, int spare_slots);

// rebalanced_rank_load_factor for one router and model, tabulated for EP degrees that are powers
// of two dividing the experts and 0 .. kMostSpareSlots spare slots (one placement each), so that a
// search of millions of strategies places nothing. Anything else is computed when asked.
class RebalancedLoads {
 public:
  static constexpr int kMostSpareSlots = 4;
  RebalancedLoads() = default;
  RebalancedLoads(double max_over_mean, int experts);
  double factor(double max_over_mean, int experts, int ranks, int spare_slots) const;

 private:
  double max_over_mean_ = 0;
  int experts_ = 0;
  std::vector<double> factors_;  // [log2(ranks) * (kMostSpareSlots + 1) + spare_slots]
};

}  // namespace rlf::sim
