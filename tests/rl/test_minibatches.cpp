// How a step's rollouts split into minibatches: each minibatch takes its share of whole prompt
// groups from every block (one per rank that generated them), as each of those ranks would on its
// own in a data-parallel run, whether the blocks are equal (synchronous pipelines) or not
// (StaleSync: every rank finished its own count of groups).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "src/rl/rl_step.h"

namespace rlf {
namespace {

// Minibatch `mb` of one rank's own rollouts, shifted to where its block starts.
std::vector<size_t> rank_share(size_t block_begin, size_t block, const RlStepSettings& settings,
                               int mb) {
  std::vector<size_t> share;
  const size_t first = minibatch_begin(block, settings.group_size, settings.minibatches, mb);
  const size_t last = minibatch_begin(block, settings.group_size, settings.minibatches, mb + 1);
  for (size_t i = first; i < last; ++i) share.push_back(block_begin + i);
  return share;
}

TEST(Minibatches, UnequalBlocksGiveEveryRankTheShareItWouldTrainAlone) {
  std::mt19937 random(20261203);
  for (int trial = 0; trial < 300; ++trial) {
    RlStepSettings settings;
    settings.group_size = 1 + int(random() % 4);
    settings.minibatches = 1 + int(random() % 4);
    const int blocks = 1 + int(random() % 5);
    size_t rollouts = 0;
    for (int b = 0; b < blocks; ++b) {
      // Whole groups, some blocks empty (a rank that finished none this step).
      settings.block_sizes.push_back(size_t(random() % 6) * size_t(settings.group_size));
      rollouts += settings.block_sizes.back();
    }
    std::vector<int> times_taken(rollouts, 0);
    for (int mb = 0; mb < settings.minibatches; ++mb) {
      std::vector<size_t> want;
      size_t begin = 0;
      for (const size_t block : settings.block_sizes) {
        const std::vector<size_t> share = rank_share(begin, block, settings, mb);
        want.insert(want.end(), share.begin(), share.end());
        begin += block;
      }
      const std::vector<size_t> got = minibatch_indices(rollouts, settings, mb);
      ASSERT_EQ(got, want) << "trial " << trial << " minibatch " << mb;
      for (const size_t i : got) ++times_taken[i];
    }
    for (size_t i = 0; i < rollouts; ++i) EXPECT_EQ(times_taken[i], 1) << "rollout " << i;
  }
}

TEST(Minibatches, EqualBlockSizesAreTheEqualBlocks) {
  RlStepSettings equal;
  equal.group_size = 2;
  equal.minibatches = 3;
  equal.sample_blocks = 4;
  RlStepSettings sized = equal;
  sized.block_sizes.assign(4, 10);
  for (int mb = 0; mb < 3; ++mb)
    EXPECT_EQ(minibatch_indices(40, sized, mb), minibatch_indices(40, equal, mb));
}

TEST(Minibatches, BlocksThatDoNotAddUpToTheRolloutsAreALogicError) {
  RlStepSettings settings;
  settings.block_sizes = {4, 4};
  EXPECT_THROW(minibatch_indices(9, settings, 0), std::logic_error);
  settings.block_sizes.clear();
  settings.sample_blocks = 2;
  EXPECT_THROW(minibatch_indices(9, settings, 0), std::logic_error);
}

}  // namespace
}  // namespace rlf
