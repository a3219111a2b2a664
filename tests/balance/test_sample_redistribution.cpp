// Planning a step's data reordering: every sample trained exactly once, canonical order on every
// rank, the same plan whatever order the samples are listed in, few samples moved, and a plan
// kept only when it beats leaving the samples where they are; and the batch-level cost fit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/error.h"
#include "src/balance/data_reordering.h"
#include "src/balance/sample_redistribution.h"

namespace rlf {
namespace {

struct Step {
  std::vector<int64_t> ids;
  std::vector<int> source;
  std::vector<double> costs;
};

// `per_rank` samples on each of `ranks` ranks (consecutive ids, as a contiguous share of a step),
// heavy-tailed lengths (lognormal, as sort-heavytail) and a quadratic cost.
Step heavy_tailed_step(int ranks, int per_rank, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::lognormal_distribution<double> length(std::log(6.0), 1.0);
  Step s;
  for (int r = 0; r < ranks; ++r) {
    for (int i = 0; i < per_rank; ++i) {
      const double L = std::clamp(std::round(length(g)), 2.0, 120.0);
      s.ids.push_back(1000 + r * per_rank + i);
      s.source.push_back(r);
      s.costs.push_back(5 * L + 0.1 * L * L);
    }
  }
  return s;
}

TEST(SampleRedistribution, EverySampleOnceInCanonicalOrderAndNoWorseThanInOrder) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const int ranks = 1 + int(seed % 6);
    const Step s = heavy_tailed_step(ranks, 3 + int(seed % 5), seed);
    const RedistributionPlan plan = plan_redistribution(s.ids, s.source, s.costs, ranks);
    ASSERT_EQ(plan.trained.size(), size_t(ranks));
    std::vector<int> all;
    for (int r = 0; r < ranks; ++r) {
      const std::vector<int>& mine = plan.trained[size_t(r)];
      double load = 0;
      for (size_t k = 0; k < mine.size(); ++k) {
        EXPECT_EQ(plan.destination[size_t(mine[k])], r);
        if (k > 0) {
          EXPECT_LT(s.ids[size_t(mine[k - 1])], s.ids[size_t(mine[k])]);
        }
        load += s.costs[size_t(mine[k])];
      }
      EXPECT_DOUBLE_EQ(plan.load[size_t(r)], load);
      all.insert(all.end(), mine.begin(), mine.end());
    }
    std::sort(all.begin(), all.end());
    ASSERT_EQ(all.size(), s.ids.size());
    for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], int(i));
    EXPECT_LE(plan.slowest(), plan.in_order_slowest());
    EXPECT_GE(plan.slowest(), plan.lower_bound - 1e-9);
    int moved = 0;
    for (size_t i = 0; i < s.ids.size(); ++i) moved += plan.destination[i] != s.source[i];
    EXPECT_EQ(plan.moved, moved);
    if (!plan.reordered) {
      EXPECT_EQ(plan.moved, 0);
    }
  }
}

TEST(SampleRedistribution, HeavyTailedStepsComeCloseToTheLowerBound) {
  // 64 samples on 4 ranks: the greedy plan within 10% of max(mean, largest sample), while the
  // contiguous shares are further off on most seeds.
  int in_order_worse = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    const Step s = heavy_tailed_step(4, 16, seed);
    const RedistributionPlan plan = plan_redistribution(s.ids, s.source, s.costs, 4);
    EXPECT_LE(plan.slowest(), 1.10 * plan.lower_bound) << "seed " << seed;
    in_order_worse += plan.in_order_slowest() > 1.10 * plan.lower_bound;
  }
  EXPECT_GE(in_order_worse, 5);
}

TEST(SampleRedistribution, ThePlanDependsOnTheSamplesNotTheOrderTheyAreListedIn) {
  const Step s = heavy_tailed_step(4, 8, 3);
  const RedistributionPlan plan = plan_redistribution(s.ids, s.source, s.costs, 4);
  std::vector<size_t> order(s.ids.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(9));
  Step shuffled;
  for (size_t i : order) {
    shuffled.ids.push_back(s.ids[i]);
    shuffled.source.push_back(s.source[i]);
    shuffled.costs.push_back(s.costs[i]);
  }
  const RedistributionPlan again =
      plan_redistribution(shuffled.ids, shuffled.source, shuffled.costs, 4);
  for (size_t k = 0; k < order.size(); ++k)
    EXPECT_EQ(again.destination[k], plan.destination[order[k]]);
  EXPECT_EQ(again.load, plan.load);
}

TEST(SampleRedistribution, BalancedSharesStayWhereTheyAre) {
  // Equal costs in equal shares: nothing can beat the current split, so nothing moves.
  const std::vector<int64_t> ids = {10, 11, 12, 13, 14, 15};
  const std::vector<int> source = {0, 0, 1, 1, 2, 2};
  const RedistributionPlan plan = plan_redistribution(ids, source, {1, 1, 1, 1, 1, 1}, 3);
  EXPECT_FALSE(plan.reordered);
  EXPECT_EQ(plan.moved, 0);
  EXPECT_EQ(plan.destination, source);
  // One long sample with three short ones on rank 0, four short ones on rank 1: the long one
  // stays on rank 0 (its bin is matched to the rank holding most of its cost), short ones move.
  const RedistributionPlan skewed = plan_redistribution(
      {0, 1, 2, 3, 4, 5, 6, 7}, {0, 0, 0, 0, 1, 1, 1, 1}, {10, 1, 1, 1, 1, 1, 1, 1}, 2);
  EXPECT_TRUE(skewed.reordered);
  EXPECT_EQ(skewed.destination[0], 0);
  EXPECT_EQ(skewed.moved, 3);
  EXPECT_DOUBLE_EQ(skewed.slowest(), 10);
  EXPECT_DOUBLE_EQ(skewed.in_order_slowest(), 13);
}

TEST(SampleRedistribution, SamplesStayWhenTheGreedyLoadAllowsIt) {
  // Six equal samples, four on rank 0: the greedy bins alternate (three would move after
  // matching), but moving one sample reaches the same slowest rank.
  const RedistributionPlan plan =
      plan_redistribution({0, 1, 2, 3, 4, 5}, {0, 0, 0, 0, 1, 1}, {4, 4, 4, 4, 4, 4}, 2);
  EXPECT_TRUE(plan.reordered);
  EXPECT_DOUBLE_EQ(plan.slowest(), 12);
  EXPECT_EQ(plan.moved, 1);
  EXPECT_EQ(plan.destination[3], 1);  // the last of rank 0's samples, costliest first
}

TEST(SampleRedistribution, EmptyStepsAndRanksWithoutSamples) {
  const RedistributionPlan empty = plan_redistribution({}, {}, {}, 3);
  EXPECT_EQ(empty.trained.size(), 3u);
  EXPECT_EQ(empty.moved, 0);
  // Rank 1 holds nothing (a StaleSync rank that finished no group): it gets work.
  const RedistributionPlan plan = plan_redistribution({0, 1, 2, 3}, {0, 0, 0, 0}, {4, 3, 2, 1}, 2);
  EXPECT_FALSE(plan.trained[1].empty());
  EXPECT_DOUBLE_EQ(plan.slowest(), 5);
}

TEST(SampleRedistribution, BadInputIsRejected) {
  EXPECT_THROW(plan_redistribution({1, 2}, {0}, {1, 1}, 2), std::invalid_argument);
  EXPECT_THROW(plan_redistribution({1, 1}, {0, 1}, {1, 1}, 2), std::invalid_argument);
  EXPECT_THROW(plan_redistribution({1, 2}, {0, 2}, {1, 1}, 2), std::invalid_argument);
  EXPECT_THROW(plan_redistribution({1, 2}, {0, 1}, {1, 1}, 0), std::invalid_argument);
  EXPECT_THROW(plan_redistribution({1, 2}, {0, 1}, {1, -1}, 2), ConfigError);
}

TEST(BatchCostModel, RecoversTheSampleModelFromBatchSums) {
  const SampleCostModel truth{2e-4, 3e-6, 5e-8};
  std::mt19937_64 g(2);
  std::vector<BatchCostObservation> batches;
  for (int b = 0; b < 12; ++b) {
    BatchCostObservation o;
    const int n = 1 + int(g() % 9);
    for (int i = 0; i < n; ++i) {
      const double L = double(4 + g() % 400);
      o.samples += 1;
      o.tokens += L;
      o.squared_tokens += L * L;
      o.seconds += truth.cost(L);
    }
    batches.push_back(o);
  }
  const std::optional<SampleCostModel> fit = fit_batch_cost_model(batches);
  ASSERT_TRUE(fit.has_value());
  EXPECT_NEAR(fit->fixed / truth.fixed, 1, 1e-6);
  EXPECT_NEAR(fit->per_token / truth.per_token, 1, 1e-6);
  EXPECT_NEAR(fit->per_token_squared / truth.per_token_squared, 1, 1e-6);
}

TEST(BatchCostModel, UndeterminedFitsAreNotFits) {
  // Fewer than three batches, or batches that are multiples of each other.
  EXPECT_FALSE(fit_batch_cost_model({{1, 4, 16, 1}, {2, 8, 32, 2}}).has_value());
  EXPECT_FALSE(fit_batch_cost_model({{1, 4, 16, 1}, {2, 8, 32, 2}, {3, 12, 48, 3}}).has_value());
  EXPECT_FALSE(fit_batch_cost_model({}).has_value());
  EXPECT_THROW(fit_batch_cost_model({{1, 4, 16, std::nan("")}}), ConfigError);
}

}  // namespace
}  // namespace rlf
