// Pipeline stage balancing: the dynamic program's split minimizes the slowest chunk, checked
// against every split of small cases; equal costs give the uniform split; the first chunk's
// embedding and the last one's head move layers away from them.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <vector>

#include "src/balance/stage_balance.h"

namespace rlf {
namespace {

double slowest(const LayerCosts& costs, const std::vector<int>& b) {
  const std::vector<double> c = chunk_costs(costs, b);
  return *std::max_element(c.begin(), c.end());
}

// The smallest slowest-chunk cost over every split into `chunks` non-empty ranges.
double brute_force(const LayerCosts& costs, int chunks) {
  const int L = int(costs.layer.size());
  double best = 1e300;
  std::vector<int> b{0};
  std::function<void()> extend = [&] {
    if (int(b.size()) == chunks) {
      b.push_back(L);
      best = std::min(best, slowest(costs, b));
      b.pop_back();
      return;
    }
    const int left = chunks - int(b.size());  // chunks after the one that ends here
    for (int end = b.back() + 1; end <= L - left; ++end) {
      b.push_back(end);
      extend();
      b.pop_back();
    }
  };
  extend();
  return best;
}

TEST(StageBalance, MinimizesTheSlowestChunkOnRandomCosts) {
  std::mt19937_64 gen(20240613);
  std::uniform_real_distribution<double> cost(0.1, 3.0);
  for (int trial = 0; trial < 300; ++trial) {
    const int L = 1 + int(gen() % 10);
    const int chunks = 1 + int(gen() % uint64_t(L));
    LayerCosts c;
    for (int l = 0; l < L; ++l) c.layer.push_back(cost(gen));
    c.first_extra = trial % 3 == 0 ? 0 : cost(gen);
    c.last_extra = trial % 2 == 0 ? 0 : 2 * cost(gen);
    const std::vector<int> b = balance_boundaries(c, chunks);
    ASSERT_EQ(int(b.size()), chunks + 1);
    EXPECT_EQ(b.front(), 0);
    EXPECT_EQ(b.back(), L);
    for (int k = 0; k < chunks; ++k) EXPECT_LT(b[size_t(k)], b[size_t(k) + 1]) << "empty chunk";
    EXPECT_NEAR(slowest(c, b), brute_force(c, chunks), 1e-12) << "L=" << L << " chunks=" << chunks;
    EXPECT_LE(slowest(c, b), slowest(c, uniform_boundaries(L, chunks)) + 1e-12);
  }
}

TEST(StageBalance, EqualCostsGiveTheUniformSplit) {
  LayerCosts c;
  c.layer.assign(12, 1.0);
  for (int chunks : {1, 2, 3, 4, 6, 12}) {
    EXPECT_EQ(balance_boundaries(c, chunks), uniform_boundaries(12, chunks)) << chunks;
  }
}

TEST(StageBalance, TheHeadMovesLayersToEarlierStages) {
  // 8 equal layers, the head and loss worth two layers: the last stage takes fewer.
  LayerCosts c;
  c.layer.assign(8, 1.0);
  c.last_extra = 2.0;
  EXPECT_EQ(balance_boundaries(c, 2), (std::vector<int>{0, 5, 8}));
  EXPECT_DOUBLE_EQ(slowest(c, balance_boundaries(c, 2)), 5.0);
  EXPECT_DOUBLE_EQ(slowest(c, uniform_boundaries(8, 2)), 6.0);
  EXPECT_EQ(chunk_costs(c, {0, 5, 8}), (std::vector<double>{5.0, 5.0}));
}

TEST(StageBalance, LayersPerChunkAndChunkBoundariesAreInverse) {
  EXPECT_EQ(chunk_boundaries({3, 1}), (std::vector<int>{0, 3, 4}));
  EXPECT_EQ(layers_per_chunk({0, 3, 4}), "3,1");
  EXPECT_EQ(layers_per_chunk(chunk_boundaries({1, 2, 3, 1})), "1,2,3,1");
  EXPECT_EQ(layers_per_chunk(uniform_boundaries(8, 4)), "2,2,2,2");
}

TEST(StageBalance, BadChunkCountsThrow) {
  LayerCosts c;
  c.layer.assign(3, 1.0);
  EXPECT_THROW(balance_boundaries(c, 4), std::invalid_argument);
  EXPECT_THROW(balance_boundaries(c, 0), std::invalid_argument);
  EXPECT_THROW(uniform_boundaries(3, 4), std::invalid_argument);
}

}  // namespace
}  // namespace rlf
