// Layouts that store only some routed experts (expert parallelism without redundant copies):
// the seeded initialization of a shard is exactly the slice of the whole model's, parameters
// move between layouts without loss, and a shard refuses to run without its dispatchers.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/arena.h"
#include "src/model/expert_parallel.h"
#include "src/model/transformer.h"
#include "tests/tiny_policy.h"

namespace rlf {
namespace {

TEST(ExpertShardLayout, ShardInitializationIsTheSliceOfTheWholeModel) {
  const ModelConfig config = test::tiny_policy_config();  // 4 experts
  const ParameterLayout whole(config);
  std::vector<float> whole_params(size_t(whole.total()));
  initialize_parameters(whole_params.data(), whole, config, 42);
  for (const ExpertShard shard : {ExpertShard{0, 1}, ExpertShard{1, 2}, ExpertShard{2, 2}}) {
    const ParameterLayout part(config, shard);
    EXPECT_TRUE(part.expert_sharded());
    EXPECT_EQ(part.first_expert(), shard.first);
    EXPECT_EQ(part.stored_experts(), shard.count);
    EXPECT_LT(part.total(), whole.total());
    std::vector<float> part_params(size_t(part.total()));
    initialize_parameters(part_params.data(), part, config, 42);
    // The replicated tensors are equal; each stored expert equals the whole model's expert.
    std::vector<float> want(size_t(part.total()), 0.0f);
    copy_common_parameters(whole_params.data(), whole, want.data(), part);
    EXPECT_EQ(0, std::memcmp(part_params.data(), want.data(), want.size() * sizeof(float)));
    const auto mine = expert_slices(part, shard.first, shard.count);
    const auto same = expert_slices(whole, shard.first, shard.count);
    ASSERT_EQ(mine.size(), size_t(3 * config.n_layers));  // w1, w3, w2 per layer
    for (size_t i = 0; i < mine.size(); ++i) {
      ASSERT_EQ(mine[i].count, same[i].count);
      EXPECT_EQ(
          0, std::memcmp(part_params.data() + mine[i].offset, whole_params.data() + same[i].offset,
                         size_t(mine[i].count) * sizeof(float)));
    }
  }
}

TEST(ExpertShardLayout, ShardsPutBackTogetherGiveTheWholeModel) {
  const ModelConfig config = test::tiny_policy_config();
  const ParameterLayout whole(config);
  std::vector<float> original(size_t(whole.total()));
  initialize_parameters(original.data(), whole, config, 7);
  std::vector<float> rebuilt(size_t(whole.total()), 0.0f);
  for (int first = 0; first < config.n_experts; first += 2) {
    const ParameterLayout part(config, {first, 2});
    std::vector<float> piece(size_t(part.total()));
    copy_common_parameters(original.data(), whole, piece.data(), part);
    copy_common_parameters(piece.data(), part, rebuilt.data(), whole);
  }
  EXPECT_EQ(0, std::memcmp(rebuilt.data(), original.data(), original.size() * sizeof(float)));
}

TEST(ExpertShardLayout, BadShardsAndShardsWithoutDispatchersAreRejected) {
  const ModelConfig config = test::tiny_policy_config();
  EXPECT_THROW(ParameterLayout(config, {3, 2}), std::invalid_argument);
  EXPECT_THROW(ParameterLayout(config, {-1, 1}), std::invalid_argument);
  EXPECT_THROW(ParameterLayout(config, {0, 0}), std::invalid_argument);
  EXPECT_FALSE(ParameterLayout(config, {0, config.n_experts}).expert_sharded());
  const ParameterLayout part(config, {2, 2});
  EXPECT_THROW(expert_slices(part, 0, 1), std::invalid_argument);
  Arena device("shard", 16 << 20);
  Transformer<float> model(config, cpu_ops(), device, false, {0, 2});
  model.initialize(1);
  const std::vector<int> tokens{1, 2, 3};
  const std::vector<int> offsets{0, 3};
  EXPECT_THROW(model.forward(tokens.data(), offsets.data(), 1), std::logic_error);
}

}  // namespace
}  // namespace rlf
