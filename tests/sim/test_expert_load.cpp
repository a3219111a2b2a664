// The busiest EP rank's expected routed rows (src/sim/expert_load.h) against exact expectations
// computed here by convolving one token's distribution over the ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "src/sim/expert_load.h"

namespace rlf::sim {
namespace {

TEST(ExpertLoad, ExpectedMaxOfNormalsKnownValues) {
  EXPECT_EQ(expected_max_of_normals(1), 0);
  // E[max] of 2 and 3 standard normals: 1/sqrt(pi) and 3/(2 sqrt(pi)); of 4: 1.0293753730.
  EXPECT_NEAR(expected_max_of_normals(2), 1 / std::sqrt(M_PI), 1e-9);
  EXPECT_NEAR(expected_max_of_normals(3), 1.5 / std::sqrt(M_PI), 1e-9);
  EXPECT_NEAR(expected_max_of_normals(4), 1.0293753730, 1e-8);
  // Beyond the table, the same quadrature: one more normal raises the maximum a little.
  const double last = expected_max_of_normals(1024), next = expected_max_of_normals(1025);
  EXPECT_GT(next, last);
  EXPECT_LT(next - last, 1e-3);
}

// Exact E[max over two ranks] of the rows `tokens` tokens put on them, each picking 2 distinct
// experts of 4 (2 a rank): rank 0 gets 0, 1 or 2 of a token's rows with probability 1/6, 4/6,
// 1/6 (C(2,0) C(2,2) / C(4,2), ...).
double exact_two_ranks(int tokens) {
  std::vector<double> rows0{1.0};
  for (int t = 0; t < tokens; ++t) {
    std::vector<double> next(rows0.size() + 2, 0.0);
    for (size_t r = 0; r < rows0.size(); ++r) {
      next[r] += rows0[r] / 6;
      next[r + 1] += rows0[r] * 4 / 6;
      next[r + 2] += rows0[r] / 6;
    }
    rows0 = next;
  }
  double expected = 0;
  for (size_t r = 0; r < rows0.size(); ++r)
    expected += rows0[r] * std::max(double(r), 2.0 * tokens - double(r));
  return expected;
}

TEST(ExpertLoad, TwoRanksMatchTheExactExpectation) {
  // 100 tokens: mean 100 rows, the approximation 100 + 0.5642 x sqrt(100 x 2/3) = 104.607.
  EXPECT_NEAR(busiest_rank_rows(100, 2, 4, 2), 100 + std::sqrt(200.0 / 3 / M_PI), 1e-9);
  for (const auto& [tokens, tolerance] : {std::pair{100, 0.005}, {50, 0.01}, {8, 0.05}}) {
    const double exact = exact_two_ranks(tokens), mean = 2.0 * tokens / 2;
    const double approx = busiest_rank_rows(tokens, 2, 4, 2);
    EXPECT_NEAR(approx - mean, exact - mean, tolerance * (exact - mean)) << tokens << " tokens";
  }
}

// Three ranks of 2 experts each (E 6, top-2): a token's two rows land on one rank (3 of the 15
// expert pairs) or on two ranks (12 of 15); the exact expectation over (rank 0, rank 1) counts.
TEST(ExpertLoad, ThreeRanksMatchTheExactExpectation) {
  const int tokens = 30, rows = 2 * tokens;
  std::vector<std::vector<double>> p(rows + 1, std::vector<double>(rows + 1, 0.0));
  p[0][0] = 1;
  // (rows on rank 0, rows on rank 1) of one token and their probabilities.
  const int outcomes[6][2] = {{2, 0}, {0, 2}, {0, 0}, {1, 1}, {1, 0}, {0, 1}};
  const double probability[6] = {1 / 15.0, 1 / 15.0, 1 / 15.0, 4 / 15.0, 4 / 15.0, 4 / 15.0};
  for (int t = 0; t < tokens; ++t) {
    std::vector<std::vector<double>> next(rows + 1, std::vector<double>(rows + 1, 0.0));
    for (int a = 0; a <= 2 * t; ++a)
      for (int b = 0; a + b <= 2 * t; ++b)
        for (int o = 0; o < 6; ++o)
          next[a + outcomes[o][0]][b + outcomes[o][1]] += p[a][b] * probability[o];
    p = next;
  }
  double exact = 0;
  for (int a = 0; a <= rows; ++a)
    for (int b = 0; a + b <= rows; ++b) exact += p[a][b] * std::max({a, b, rows - a - b});
  const double mean = rows / 3.0;
  EXPECT_NEAR(busiest_rank_rows(tokens, 2, 6, 3) - mean, exact - mean, 0.03 * (exact - mean));
}

TEST(ExpertLoad, NoImbalanceWithOneRankOrEveryExpertChosen) {
  EXPECT_DOUBLE_EQ(busiest_rank_rows(64, 2, 8, 1), 128);
  EXPECT_DOUBLE_EQ(busiest_rank_rows(64, 4, 4, 2), 128);  // every token on every expert
  EXPECT_DOUBLE_EQ(busiest_rank_rows(0, 2, 8, 4), 0);
  // The excess over the mean grows as the square root of the tokens: its share shrinks.
  const double small = busiest_rank_rows(100, 8, 256, 64) / (100 * 8 / 64.0);
  const double large = busiest_rank_rows(16384, 8, 256, 64) / (16384 * 8 / 64.0);
  EXPECT_GT(small, large);
  EXPECT_NEAR(large - 1, (small - 1) / std::sqrt(163.84), 1e-9);
}

// The router's concentration c (the busiest expert's tokens over the mean expert's): the rank
// holding the hottest expert gets P (c + (E / P - 1) (E - c) / (E - 1)) / E of the mean rank's
// rows.
TEST(ExpertLoad, HottestRankLoadFactorByHand) {
  EXPECT_DOUBLE_EQ(hottest_rank_load_factor(1, 16, 4), 1);     // uniform
  EXPECT_DOUBLE_EQ(hottest_rank_load_factor(3, 16, 1), 1);     // one rank holds everything
  EXPECT_DOUBLE_EQ(hottest_rank_load_factor(2.5, 8, 8), 2.5);  // one expert a rank
  // 8 experts on 2 ranks, c = 3: the hottest at 3, the 7 others at 5/7 each, 3 of them beside it.
  EXPECT_NEAR(hottest_rank_load_factor(3, 8, 2), 2 * (3 + 3 * 5.0 / 7) / 8, 1e-15);
  // At c = 1 the busiest rank's rows are the uniform router's.
  EXPECT_DOUBLE_EQ(busiest_rank_rows(100, 2, 4, 2, 1), busiest_rank_rows(100, 2, 4, 2));
}

// Exact E[max(r, n - r)] for r ~ Binomial(n, p): the busier of two ranks when each of n tokens
// sends its one row to rank 0 with probability p.
double exact_busier_of_two(int n, double p) {
  double expected = 0, choose = 1;  // C(n, r), built up in r
  for (int r = 0; r <= n; ++r) {
    if (r > 0) choose = choose * (n - r + 1) / r;
    expected += choose * std::pow(p, r) * std::pow(1 - p, n - r) * std::max(r, n - r);
  }
  return expected;
}

// A concentrated top-1 router over two ranks: one expert a rank (rank 0 gets a token's row with
// probability c / 2) and two a rank (c / 4 + (4 - c) / 12: the hottest and one of the others).
// The approximation within 1.6% of the exact expectation from a uniform router (c = 1) to c = 2,
// where the hottest rank's mean decides.
TEST(ExpertLoad, ConcentratedRouterAgainstExactTwoRanks) {
  for (const double c : {1.0, 1.02, 1.05, 1.1, 1.2, 1.3, 1.5, 1.8, 2.0}) {
    SCOPED_TRACE("c = " + std::to_string(c));
    const double one = exact_busier_of_two(100, c / 2);
    EXPECT_NEAR(busiest_rank_rows(100, 1, 2, 2, c), one, 0.016 * one);
    const double two = exact_busier_of_two(100, c / 4 + (4 - c) / 12);
    EXPECT_NEAR(busiest_rank_rows(100, 1, 4, 2, c), two, 0.016 * two);
  }
  // Never below the uniform router's, and growing with c.
  double previous = busiest_rank_rows(100, 2, 8, 4);
  for (const double c : {1.5, 2.0, 3.0, 4.0}) {
    const double rows = busiest_rank_rows(100, 2, 8, 4, c);
    EXPECT_GE(rows, previous);
    previous = rows;
  }
  EXPECT_NEAR(busiest_rank_rows(100, 2, 8, 4, 4.0), 50 * 4 * (4 + 1 * 4.0 / 7) / 8, 1e-12);
}

// The router's loads as EDPB's placement sees them: the hottest at c, the rest geometric, mean 1.
// E 4 at c 2: the first share (1 - r) / (1 - r^4) = 1/2 gives r^3 + r^2 + r = 1, r = 0.5436890127
// (the loads 2, 2r, 2r^2, 2r^3).
double tribonacci_ratio() {
  double r = 0.5;
  for (int i = 0; i < 100; ++i) r = 1 / (1 + r + r * r);  // r (1 + r + r^2) = 1
  return r;
}

TEST(ExpertLoad, GeometricRouterLoadsByHand) {
  const double r = tribonacci_ratio();
  EXPECT_NEAR(r, 0.5436890127, 1e-10);
  const std::vector<double> loads = geometric_router_loads(2, 4);
  ASSERT_EQ(loads.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(loads[size_t(i)], 2 * std::pow(r, i), 1e-9) << i;
  // Uniform for c = 1; mean 1 and the hottest at c for any c; decaying.
  for (double l : geometric_router_loads(1, 8)) EXPECT_DOUBLE_EQ(l, 1);
  for (const double c : {1.2, 3.0, 6.5}) {
    const std::vector<double> l = geometric_router_loads(c, 16);
    double sum = 0;
    for (double v : l) sum += v;
    EXPECT_NEAR(sum, 16, 1e-9);
    EXPECT_NEAR(l[0], c, 1e-9);
    for (size_t i = 1; i < l.size(); ++i) EXPECT_LT(l[i], l[i - 1]);
  }
}

// EDPB's placement of those loads, by hand (loads 2, 2r, 2r^2, 2r^3 above, 2 ranks, heaviest
// first onto the least loaded rank with a free slot, one copy of an expert per rank):
// - no spare slot (`--rebalance-every` alone): 2 -> A, 2r -> B, 2r^2 -> B, 2r^3 -> A (B full):
//   A = 2 + 2r^3 over the mean 2: 1 + r^3 = 1.1607 (contiguous blocks, the hottest and the even
//   rest: 2 (2 + 2/3) / 4 = 1.333);
// - one spare slot each: the two hottest replicated (1, 1 and r, r), then 1 -> A, 1 -> B,
//   2r^2 -> A, r -> B, r -> A (B holds it), 2r^3 -> B: A = 1 + 2r^2 + r over 2 = 1.0674.
TEST(ExpertLoad, RebalancedLoadFactorByHand) {
  const double r = tribonacci_ratio();
  EXPECT_DOUBLE_EQ(rebalanced_rank_load_factor(1, 8, 2, 1), 1);  // uniform stays uniform
  EXPECT_NEAR(rebalanced_rank_load_factor(2, 4, 2, 0), 1 + r * r * r, 1e-9);
  EXPECT_NEAR(hottest_rank_load_factor(2, 4, 2), 2 * (2 + 2.0 / 3) / 4, 1e-12);
  EXPECT_NEAR(rebalanced_rank_load_factor(2, 4, 2, 1), (1 + 2 * r * r + r) / 2, 1e-9);
  EXPECT_DOUBLE_EQ(rebalanced_rank_load_factor(3, 16, 1, 2), 1);  // one rank holds every load
  // Moving experts pairs the hot ones with cold ones: below the contiguous blocks for every
  // concentrated router, spare slots or not, and never below an even split.
  for (const double c : {1.5, 3.0, 6.0}) {
    for (int spare = 0; spare <= 4; ++spare) {
      const double factor = rebalanced_rank_load_factor(c, 32, 8, spare);
      EXPECT_LT(factor, hottest_rank_load_factor(c, 32, 8)) << "c " << c << ", spare " << spare;
      EXPECT_GE(factor, 1 - 1e-12);
    }
  }
}

// EDPB's first decision from the contiguous blocks: tiny's 4 experts at EP 2 with c = 2 start
// {0, 1} {2, 3}, the two hottest together; the placement pairs the hottest with the coldest,
// {0, 3} {1, 2}, which renumbered to move least has each rank receive one expert. A uniform router
// or one rank moves nothing, and a rank never receives more experts than it has slots.
TEST(ExpertLoad, FirstPlacementReceivedByHand) {
  EXPECT_EQ(first_placement_received(2, 4, 2, 0), 1);
  EXPECT_EQ(first_placement_received(1, 4, 2, 0), 0);
  EXPECT_EQ(first_placement_received(3, 16, 1, 0), 0);
  for (const double c : {1.5, 3.0, 6.0}) {
    for (const int ranks : {2, 4, 8}) {
      for (int spare = 0; spare <= 2; ++spare) {
        const int received = first_placement_received(c, 32, ranks, spare);
        EXPECT_GT(received, 0) << "c " << c << ", " << ranks << " ranks, spare " << spare;
        EXPECT_LE(received, 32 / ranks + spare) << "c " << c << ", " << ranks << " ranks";
      }
    }
  }
}

// The table a search reads gives the placements' own factors, and anything outside it (another
// router, model, EP degree or spare count) is computed, not taken from a neighbour.
TEST(ExpertLoad, RebalancedLoadsTableEqualsThePlacements) {
  const RebalancedLoads table(3.5, 16);
  for (int ranks : {1, 2, 4, 8, 16}) {
    for (int spare = 0; spare <= RebalancedLoads::kMostSpareSlots; ++spare) {
      if (16 / ranks + spare > 16) continue;
      EXPECT_EQ(table.factor(3.5, 16, ranks, spare),
                rebalanced_rank_load_factor(3.5, 16, ranks, spare))
          << ranks << " ranks, " << spare << " spare";
    }
  }
  EXPECT_EQ(table.factor(2.0, 16, 4, 1), rebalanced_rank_load_factor(2.0, 16, 4, 1));
  EXPECT_EQ(table.factor(3.5, 32, 4, 1), rebalanced_rank_load_factor(3.5, 32, 4, 1));
  EXPECT_EQ(table.factor(3.5, 12, 3, 1), rebalanced_rank_load_factor(3.5, 12, 3, 1));
  EXPECT_EQ(table.factor(3.5, 16, 4, 6), rebalanced_rank_load_factor(3.5, 16, 4, 6));
  EXPECT_EQ(RebalancedLoads().factor(3.5, 16, 4, 1), rebalanced_rank_load_factor(3.5, 16, 4, 1));
}

}  // namespace
}  // namespace rlf::sim
