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

}  // namespace
}  // namespace rlf::sim
