// The order behind generation TP groups across data-parallel EP training
// (src/runtime/expert_aligned_tensor_groups.h): a permutation whose runs of G ranks are TP groups
// holding one expert block each, with every training EP group (E consecutive ranks) one TP place
// of E consecutive groups; and the shapes it refuses.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "src/runtime/expert_aligned_tensor_groups.h"

namespace rlf {
namespace {

TEST(ExpertAlignedTensorGroups, ByHand) {
  // 4 ranks, TP 2 x EP 2: groups {0, 2} (block 0) and {1, 3} (block 1).
  EXPECT_EQ(expert_aligned_tensor_position(0, 2, 2), 0);
  EXPECT_EQ(expert_aligned_tensor_position(2, 2, 2), 1);
  EXPECT_EQ(expert_aligned_tensor_position(1, 2, 2), 2);
  EXPECT_EQ(expert_aligned_tensor_position(3, 2, 2), 3);
  // 12 ranks, TP 3 x EP 2 in runs of 6: the second run's block-1 group is {7, 9, 11}.
  EXPECT_EQ(expert_aligned_tensor_position(7, 3, 2), 9);
  EXPECT_EQ(expert_aligned_tensor_position(9, 3, 2), 10);
  EXPECT_EQ(expert_aligned_tensor_position(11, 3, 2), 11);
  // EP 1: the consecutive groups.
  for (int r = 0; r < 8; ++r) EXPECT_EQ(expert_aligned_tensor_position(r, 4, 1), r);
}

TEST(ExpertAlignedTensorGroups, GroupsHoldOneBlockAndEachExpertGroupIsOnePlace) {
  for (int ep = 1; ep <= 4; ++ep) {
    for (int tp = 1; tp <= 4; ++tp) {
      for (int runs = 1; runs <= 3; ++runs) {
        const int ranks = tp * ep * runs;
        SCOPED_TRACE("TP " + std::to_string(tp) + " x EP " + std::to_string(ep) + " on " +
                     std::to_string(ranks) + " ranks");
        ASSERT_EQ(expert_aligned_tensor_problem(ranks, tp, ep), "");
        std::vector<int> rank_at(size_t(ranks), -1);
        for (int r = 0; r < ranks; ++r) {
          const int position = expert_aligned_tensor_position(r, tp, ep);
          ASSERT_GE(position, 0);
          ASSERT_LT(position, ranks);
          ASSERT_EQ(rank_at[size_t(position)], -1) << "two ranks at position " << position;
          rank_at[size_t(position)] = r;
        }
        // TP group g = positions [g tp, (g + 1) tp): one expert block (training EP rank r % ep).
        for (int g = 0; g < ranks / tp; ++g) {
          std::set<int> blocks;
          for (int t = 0; t < tp; ++t) blocks.insert(rank_at[size_t(g * tp + t)] % ep);
          EXPECT_EQ(blocks.size(), 1u) << "TP group " << g;
        }
        // Training EP group: ranks [k ep, (k + 1) ep), one TP place, consecutive TP groups.
        for (int k = 0; k < ranks / ep; ++k) {
          std::set<int> places, groups;
          for (int e = 0; e < ep; ++e) {
            const int position = expert_aligned_tensor_position(k * ep + e, tp, ep);
            places.insert(position % tp);
            groups.insert(position / tp);
          }
          EXPECT_EQ(places.size(), 1u) << "EP group " << k;
          ASSERT_EQ(int(groups.size()), ep);
          EXPECT_EQ(*groups.rbegin() - *groups.begin(), ep - 1) << "EP group " << k;
          EXPECT_EQ(*groups.begin() % ep, 0) << "EP group " << k;
        }
      }
    }
  }
}

TEST(ExpertAlignedTensorGroups, RunsThatDoNotTileTheRanksAreRefused) {
  EXPECT_NE(expert_aligned_tensor_problem(4, 2, 4), "");
  EXPECT_NE(expert_aligned_tensor_problem(6, 2, 2), "");
  const std::string problem = expert_aligned_tensor_problem(6, 4, 1);
  EXPECT_NE(problem.find("TP 4 x EP 1 = 4 must divide the 6 ranks"), std::string::npos) << problem;
  EXPECT_EQ(expert_aligned_tensor_problem(12, 2, 3), "");
}

}  // namespace
}  // namespace rlf
