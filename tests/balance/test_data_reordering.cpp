// Data reordering: the least-squares cost model and the greedy assignment to data-parallel ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/error.h"
#include "src/balance/data_reordering.h"
#include "src/balance/expert_placement.h"

namespace rlf {
namespace {

TEST(CostModel, RecoversKnownCoefficients) {
  const SampleCostModel truth{2e-4, 3e-6, 5e-8};
  std::vector<double> lengths, seconds;
  for (int L = 4; L <= 4096; L *= 2) {
    lengths.push_back(L);
    seconds.push_back(truth.cost(L));
  }
  const SampleCostModel fit = fit_sample_cost_model(lengths, seconds);
  EXPECT_NEAR(fit.fixed, truth.fixed, 1e-9 * truth.fixed + 1e-15);
  EXPECT_NEAR(fit.per_token, truth.per_token, 1e-8 * truth.per_token);
  EXPECT_NEAR(fit.per_token_squared, truth.per_token_squared, 1e-8 * truth.per_token_squared);
  // With 2% multiplicative noise and many points, within a few percent of each coefficient.
  std::mt19937_64 g(1);
  std::normal_distribution<double> noise(0, 0.02);
  lengths.clear();
  seconds.clear();
  for (int i = 0; i < 400; ++i) {
    const double L = 1 + double(i % 200) * 10;
    lengths.push_back(L);
    seconds.push_back(truth.cost(L) * (1 + noise(g)));
  }
  const SampleCostModel noisy = fit_sample_cost_model(lengths, seconds);
  EXPECT_NEAR(noisy.per_token_squared / truth.per_token_squared, 1, 0.05);
  EXPECT_NEAR(noisy.cost(1000) / truth.cost(1000), 1, 0.02);
}

TEST(CostModel, BadInputIsAConfigError) {
  EXPECT_THROW(fit_sample_cost_model({1, 2, 2}, {1, 2, 3}), ConfigError);  // 2 distinct lengths
  EXPECT_THROW(fit_sample_cost_model({1, 2, 3}, {1, 2}), ConfigError);
  EXPECT_THROW(fit_sample_cost_model({1, 2, std::nan("")}, {1, 2, 3}), ConfigError);
}

// Heavy-tailed costs: lognormal lengths (median 4, sigma 1, as sort-heavytail) and a quadratic
// cost.
std::vector<double> heavy_tailed_costs(int n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::lognormal_distribution<double> length(std::log(4.0), 0.98);
  std::vector<double> costs;
  for (int i = 0; i < n; ++i) {
    const double L = 2 * std::clamp(std::round(length(g)), 1.0, 48.0) + 3;
    costs.push_back(1e-4 + 4e-6 * L + 2e-8 * L * L);
  }
  return costs;
}

TEST(Reordering, KeepsTheBatchAndMeetsGrahamsBound) {
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    const int ranks = 1 + int(seed % 8);
    const std::vector<double> costs = heavy_tailed_costs(37 + int(seed) * 7, seed);
    const RankAssignment a = assign_samples_to_ranks(costs, ranks);
    ASSERT_EQ(a.samples.size(), size_t(ranks));
    std::vector<int> all;
    for (const auto& s : a.samples) all.insert(all.end(), s.begin(), s.end());
    std::sort(all.begin(), all.end());
    ASSERT_EQ(all.size(), costs.size());
    for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], int(i));  // each sample exactly once
    // Proven (Graham): slowest <= mean + (1 - 1/m) x the smallest sample on the slowest rank
    // (the last one it received).
    const size_t slowest = size_t(std::max_element(a.load.begin(), a.load.end()) - a.load.begin());
    double last = 1e300;
    for (int i : a.samples[slowest]) last = std::min(last, costs[size_t(i)]);
    EXPECT_LE(max_of(a.load), mean_of(a.load) + (1 - 1.0 / ranks) * last + 1e-12);
    EXPECT_GE(max_of(a.load), assignment_lower_bound(costs, ranks) - 1e-12);
    // Better than (or equal to) the data loader's consecutive blocks.
    EXPECT_LE(max_of(a.load), max_of(assign_samples_in_order(costs, ranks).load) + 1e-12);
  }
}

TEST(Reordering, WithinFourThirdsOfTheOptimum) {
  // Exhaustive optimum on small instances: LPT <= (4/3 - 1/(3m)) OPT (Graham 1969).
  std::mt19937_64 g(4);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 9, m = 3;
    std::vector<double> costs;
    for (int i = 0; i < n; ++i) costs.push_back(double(g() % 50 + 1));
    double best = 1e300;
    for (int code = 0; code < 19683; ++code) {  // 3^9 assignments
      std::vector<double> load(m, 0);
      for (int i = 0, c = code; i < n; ++i, c /= 3) load[size_t(c % 3)] += costs[size_t(i)];
      best = std::min(best, max_of(load));
    }
    EXPECT_LE(max_of(assign_samples_to_ranks(costs, m).load), (4.0 / 3 - 1.0 / 9) * best + 1e-9);
  }
}

TEST(Reordering, MeetsTheBenchTargetOnHeavyTails) {
  // 256 samples on 8 ranks: the slowest rank within 10% of max(mean, largest sample).
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    const std::vector<double> costs = heavy_tailed_costs(256, seed);
    const double bound = assignment_lower_bound(costs, 8);
    EXPECT_LE(max_of(assign_samples_to_ranks(costs, 8).load), 1.10 * bound) << "seed " << seed;
  }
}

TEST(Reordering, BadInputIsAConfigError) {
  EXPECT_THROW(assign_samples_to_ranks({1, 2}, 0), ConfigError);
  EXPECT_THROW(assign_samples_to_ranks({1, -2}, 2), ConfigError);
  EXPECT_THROW(assign_samples_to_ranks({1, std::nan("")}, 2), ConfigError);
  EXPECT_NO_THROW(assign_samples_to_ranks({}, 2));
}

}  // namespace
}  // namespace rlf
