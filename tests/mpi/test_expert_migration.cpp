// Expert migration (src/runtime/expert_migration.h): two EP learners train on the same batches;
// one moves every expert to another rank (weights and both AdamW moments, rank to rank) midway.
// Without replicas the math is unchanged: the gathered weights and the loss on a fixed batch stay
// bit-identical to the learner that never migrated, step after step, with gradient clipping on
// (its global norm sums the experts' squared norms in expert-id order, wherever they live).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "kernels/arena.h"
#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/topology.h"
#include "src/model/expert_parallel.h"
#include "src/rl/rl_step.h"
#include "src/rl/task.h"
#include "src/runtime/role_expert_parallel.h"
#include "tests/mpi/fixed_batch_loss.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/rl_batch.h"
#include "tests/test_util.h"
#include "tests/tiny_policy.h"

namespace rlf {
namespace {

TEST(ExpertMigration, MovingEveryExpertKeepsTrainingBitIdentical) {
  const int rank = test::world_rank(), size = test::world_size();
  if (size != 2 && size != 4) GTEST_SKIP() << "EP 2 over 2 or 4 ranks";
  const std::unique_ptr<Task> task = make_task({"sort", 1, {}});
  Links links(test::virtual_node_list(size, size % 2 == 0 ? 2 : 1), LinkEmulation{});
  HierarchicalComm learners = make_hierarchical(MPI_COMM_WORLD, links);
  const ModelConfig config = test::tiny_policy_config();
  const int E = config.n_experts, degree = 2;
  std::vector<int> reversed(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) reversed[size_t(e)] = E - 1 - e;  // every expert changes rank
  for (DispatchMode mode : {DispatchMode::Flat, DispatchMode::Hierarchical}) {
    SCOPED_TRACE(dispatch_mode_name(mode));
    RoleExpertParallel ep_still(learners, links, E, degree, mode),
        ep_moved(learners, links, E, degree, mode);
    Arena generator_device("generator", 64 << 20), still_device("still", 64 << 20),
        moved_device("moved", 64 << 20);
    Transformer<float> generator(config, cpu_ops(), generator_device, false);
    Transformer<float> still(config, cpu_ops(), still_device, true, ep_still.shard());
    Transformer<float> moved(config, cpu_ops(), moved_device, true, ep_moved.shard());
    generator.initialize(5);
    still.initialize(5);
    moved.initialize(5);
    // Clipping on, with a bound below the tiny model's usual gradient norms.
    AdamW<float> still_opt(still, AdamWHyper{}, 0.05f), moved_opt(moved, AdamWHyper{}, 0.05f);
    ep_still.attach(still);
    ep_moved.attach(moved);
    still_opt.set_shard(ep_still.optimizer_shard(still.layout()));
    moved_opt.set_shard(ep_moved.optimizer_shard(moved.layout()));
    auto hooks_of = [](RoleExpertParallel& ep, Transformer<float>& model) {
      DataParallelHooks hooks;
      hooks.sum = [](double x) {
        MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        return x;
      };
      hooks.reduce_gradients = [&ep, &model] {
        ep.reduce_gradients(model.gradients(), model.layout());
      };
      return hooks;
    };
    const DataParallelHooks still_hooks = hooks_of(ep_still, still),
                            moved_hooks = hooks_of(ep_moved, moved);
    RlStepSettings settings;
    settings.group_size = test::kBatchGroupSize;
    settings.micro_batch = 5;
    const ParameterLayout full_layout(config);
    std::vector<float> full_still(size_t(full_layout.total())), full_moved(full_still.size());
    for (int step = 0; step < 4; ++step) {
      if (step == 2) {
        const uint64_t sent = ep_moved.migrate_experts(
            reversed, moved.layout(),
            {moved.parameters(), moved_opt.first_moment(), moved_opt.second_moment()});
        EXPECT_GT(sent, 0u);
        for (const std::vector<int>& layer : ep_moved.expert_slots()) EXPECT_EQ(layer, reversed);
      }
      const std::vector<Rollout> batch = test::global_rl_batch(generator, *task, step);
      std::vector<Rollout> share;
      for (size_t i = 0; i < batch.size(); ++i)
        if (int(i % size_t(size)) == rank) share.push_back(batch[i]);
      optimize_on_rollouts(still, still_opt, share, settings, still_hooks);
      optimize_on_rollouts(moved, moved_opt, share, settings, moved_hooks);
      EXPECT_EQ(test::fixed_batch_loss(moved), test::fixed_batch_loss(still)) << "step " << step;
      ep_still.gather_full_model(still.parameters(), still.layout(), full_still.data(),
                                 full_layout);
      ep_moved.gather_full_model(moved.parameters(), moved.layout(), full_moved.data(),
                                 full_layout);
      if (rank == 0) {
        EXPECT_EQ(
            std::memcmp(full_still.data(), full_moved.data(), full_still.size() * sizeof(float)), 0)
            << "gathered weights differ after step " << step;
      }
    }
    // The moved learner's slots hold other experts than the still one's (the test can fail).
    if (rank == 0) {
      const std::vector<ParameterRange> slot0 = expert_slices(moved.layout(), 0, 1);
      EXPECT_NE(std::memcmp(moved.parameters() + slot0[0].offset,
                            still.parameters() + slot0[0].offset, size_t(slot0[0].count) * 4),
                0);
    }
  }
  free_hierarchical(learners);
}

TEST(ExpertMigration, ATableThatIsNotAPermutationIsRejected) {
  const int size = test::world_size();
  if (size != 2 && size != 4) GTEST_SKIP() << "EP 2 over 2 or 4 ranks";
  Links links(test::virtual_node_list(size, 1), LinkEmulation{});
  HierarchicalComm learners = make_hierarchical(MPI_COMM_WORLD, links);
  {
    RoleExpertParallel ep(learners, links, 4, 2, DispatchMode::Flat);
    const ParameterLayout layout(test::tiny_policy_config(), ep.shard());
    EXPECT_THROW(ep.migrate_experts({0, 0, 1, 2}, layout, {}), std::invalid_argument);
  }
  free_hierarchical(learners);
}

}  // namespace
}  // namespace rlf
