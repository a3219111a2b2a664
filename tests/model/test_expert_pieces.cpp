// The routed expert FFN in pieces of whole experts (src/model/expert_pieces.h): the pieces cover
// the experts in order with about equal rows, each with rows of its own; the grouped kernels over
// the pieces give the whole call's bits, forward and backward, on every backend with rows blocked
// (experts past the kernels' 128-row block, experts without rows, one hot expert).
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "kernels/ops.h"
#include "src/model/expert_pieces.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

std::vector<int> offsets_of(const std::vector<int>& rows) {
  std::vector<int> offsets(1, 0);
  for (int r : rows) offsets.push_back(offsets.back() + r);
  return offsets;
}

TEST(ExpertPieces, HandMadeCases) {
  const auto pieces_of = [](const std::vector<int>& rows, int pieces) {
    std::vector<std::pair<int, int>> out;
    const std::vector<int> offsets = offsets_of(rows);
    for (const ExpertRange& p : expert_pieces(offsets.data(), int(rows.size()), pieces))
      out.emplace_back(p.first, p.count);
    return out;
  };
  using Pieces = std::vector<std::pair<int, int>>;
  EXPECT_EQ(pieces_of({10, 10, 10, 10}, 4), (Pieces{{0, 1}, {1, 1}, {2, 1}, {3, 1}}));
  EXPECT_EQ(pieces_of({10, 10, 10, 10}, 2), (Pieces{{0, 2}, {2, 2}}));
  EXPECT_EQ(pieces_of({10, 10, 10, 10}, 1), (Pieces{{0, 4}}));
  // One hot expert: a piece of its own, the rest after it.
  EXPECT_EQ(pieces_of({0, 40, 0, 1}, 4), (Pieces{{0, 2}, {2, 2}}));
  EXPECT_EQ(pieces_of({1, 1, 40, 0, 0}, 4), (Pieces{{0, 5}}));
  EXPECT_EQ(pieces_of({5, 0, 0, 5}, 4), (Pieces{{0, 1}, {1, 3}}));
  EXPECT_TRUE(pieces_of({0, 0, 0}, 4).empty());
  EXPECT_TRUE(pieces_of({}, 4).empty());
}

TEST(ExpertPieces, CoverTheExpertsInOrderEachWithRowsAndEndAtTheFirstBoundaryPastItsShare) {
  std::mt19937 rng(uint32_t(test::seed_for("ExpertPieces.Cover", 0)));
  for (int trial = 0; trial < 2000; ++trial) {
    const int E = 1 + int(rng() % 17), pieces = 1 + int(rng() % 6);
    std::vector<int> rows(static_cast<size_t>(E), 0);
    for (int& r : rows) r = rng() % 3 == 0 ? 0 : int(rng() % (rng() % 4 == 0 ? 300 : 20));
    const std::vector<int> offsets = offsets_of(rows);
    const int64_t total = offsets.back();
    const std::vector<ExpertRange> got = expert_pieces(offsets.data(), E, pieces);
    SCOPED_TRACE("trial " + std::to_string(trial));
    if (total == 0) {
      EXPECT_TRUE(got.empty());
      continue;
    }
    ASSERT_FALSE(got.empty());
    ASSERT_LE(int(got.size()), pieces);
    int next = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].first, next);
      ASSERT_GT(got[i].count, 0);
      const int end = got[i].first + got[i].count;
      EXPECT_GT(offsets[size_t(end)], offsets[size_t(got[i].first)]) << "a piece without rows";
      if (i + 1 < got.size()) {
        // Not the last: its last expert has rows and reaches the share; no earlier boundary of
        // an expert with rows does.
        EXPECT_GT(rows[size_t(end - 1)], 0);
        EXPECT_GE(int64_t(offsets[size_t(end)]) * pieces, int64_t(i + 1) * total);
        for (int b = got[i].first + 1; b < end; ++b) {
          if (rows[size_t(b - 1)] > 0) {
            EXPECT_LT(int64_t(offsets[size_t(b)]) * pieces, int64_t(i + 1) * total);
          }
        }
      }
      next = end;
    }
    EXPECT_EQ(next, E);
  }
}

// The whole grouped call against the same call piece by piece, on `ops`.
void expect_pieces_give_the_whole_calls_bits(const Ops<float>& ops, const std::string& name) {
  const int C = 24, F = 40;
  int index = 0;
  for (const std::vector<int>& rows :
       {std::vector<int>{3, 0, 200, 7, 0, 0, 150, 1}, std::vector<int>{0, 0, 300, 0},
        std::vector<int>{5, 5, 5, 5, 5, 5}, std::vector<int>{129, 0}}) {
    SCOPED_TRACE(name + " case " + std::to_string(index));
    const uint64_t seed = test::seed_for("ExpertPieces.Bits", index++);
    const int E = int(rows.size());
    const std::vector<int> offsets = offsets_of(rows);
    const size_t M = size_t(offsets.back());
    const std::vector<float> xg = test::random_vector<float>(M * C, seed);
    const std::vector<float> dy = test::random_vector<float>(M * C, seed + 1);
    const std::vector<float> weights = test::random_vector<float>(size_t(E) * 3 * F * C, seed + 2);
    const std::vector<float> grad_init =
        test::random_vector<float>(size_t(E) * 3 * F * C, seed + 3);
    const std::vector<float> dxg_init = test::random_vector<float>(M * C, seed + 4);
    std::vector<const float*> w1, w3, w2;
    for (int e = 0; e < E; ++e) {
      const float* base = weights.data() + size_t(e) * 3 * F * C;
      w1.push_back(base);
      w3.push_back(base + F * C);
      w2.push_back(base + 2 * F * C);
    }
    // Runs forward and backward, whole or in pieces: y, a, b, dxg and the weight gradients.
    const auto run = [&](bool in_pieces) {
      std::vector<float> y(M * C, 7.0f), a(M * F, 7.0f), b(M * F, 7.0f), dxg = dxg_init;
      std::vector<float> grads = grad_init;
      std::vector<float*> g1, g3, g2;
      for (int e = 0; e < E; ++e) {
        float* base = grads.data() + size_t(e) * 3 * F * C;
        g1.push_back(base);
        g3.push_back(base + F * C);
        g2.push_back(base + 2 * F * C);
      }
      Arena& device = test::scratch_arena();
      if (!in_pieces) {
        ops.expert_ffn_forward(y.data(), a.data(), b.data(), xg.data(), w1.data(), w3.data(),
                               w2.data(), offsets.data(), E, C, F, device);
        ops.expert_ffn_backward(dxg.data(), g1.data(), g3.data(), g2.data(), dy.data(), xg.data(),
                                a.data(), b.data(), w1.data(), w3.data(), w2.data(), offsets.data(),
                                E, C, F, device);
      } else {
        const std::vector<ExpertRange> pieces = expert_pieces(offsets.data(), E);
        EXPECT_GE(pieces.size(), 1u);
        for (const ExpertRange& p : pieces)
          expert_ffn_forward_piece(ops, y.data(), a.data(), b.data(), xg.data(), w1.data(),
                                   w3.data(), w2.data(), offsets.data(), p, C, F, device);
        for (const ExpertRange& p : pieces)
          expert_ffn_backward_piece(ops, dxg.data(), g1.data(), g3.data(), g2.data(), dy.data(),
                                    xg.data(), a.data(), b.data(), w1.data(), w3.data(), w2.data(),
                                    offsets.data(), p, C, F, device);
      }
      return std::vector<std::vector<float>>{y, a, b, dxg, grads};
    };
    const auto whole = run(false), pieces = run(true);
    const char* names[] = {"y", "a", "b", "dxg", "weight gradients"};
    for (size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(pieces[i], whole[i]) << names[i];
  }
}

TEST(ExpertPieces, PiecesGiveTheWholeCallsBits) {
  expect_pieces_give_the_whole_calls_bits(cpu_ops(), "cpu");
  expect_pieces_give_the_whole_calls_bits(reference_ops<float>(), "reference");
}

}  // namespace
}  // namespace rlf
