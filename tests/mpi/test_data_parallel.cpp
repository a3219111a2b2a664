// Data-parallel learners: N ranks, each training on its share of the same global batch (in
// whatever order the samples arrived, put back in canonical order) with the summed normalizer and
// a hierarchical gradient allreduce, end with the weights one rank gets on the whole batch.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "kernels/arena.h"
#include "mpi_comm/hierarchical_collectives.h"
#include "mpi_comm/topology.h"
#include "src/rl/rl_step.h"
#include "src/rl/task.h"
#include "src/rl/tokenizer.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/rl_batch.h"
#include "tests/test_util.h"
#include "tests/tiny_policy.h"

namespace rlf {
namespace {

bool canonical_less(const Rollout& a, const Rollout& b) {
  return a.task_sample.id != b.task_sample.id ? a.task_sample.id < b.task_sample.id
                                              : a.sample_id < b.sample_id;
}

TEST(DataParallelLearners, NRanksGiveTheWeightsOfOneRankOnTheSameGlobalBatch) {
  const int rank = test::world_rank(), size = test::world_size();
  const std::unique_ptr<Task> task = make_task({"sort", 1, {}});
  Links links(test::virtual_node_list(size, 2), LinkEmulation{});
  HierarchicalComm learners = make_hierarchical(MPI_COMM_WORLD, links);

  Arena single_device("single", 64 << 20), parallel_device("parallel", 64 << 20);
  Transformer<float> single(test::tiny_policy_config_without_aux_loss(), cpu_ops(), single_device,
                            true);
  Transformer<float> parallel(test::tiny_policy_config_without_aux_loss(), cpu_ops(),
                              parallel_device, true);
  single.initialize(5);
  parallel.initialize(5);
  AdamW<float> single_opt(single, AdamWHyper{}, 1.0f), parallel_opt(parallel, AdamWHyper{}, 1.0f);
  DataParallelHooks hooks;
  hooks.sum = [&](double x) {
    MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return x;
  };
  hooks.reduce_gradients = [&] {
    allreduce_sum(parallel.gradients(), parallel.parameter_count(), learners, links);
  };
  RlStepSettings settings;
  settings.group_size = test::kBatchGroupSize;
  settings.micro_batch = 5;
  for (int step = 0; step < 2; ++step) {
    // Every rank generates the whole global batch with the (identical) single-rank weights.
    const std::vector<Rollout> batch = test::global_rl_batch(single, *task, step);
    // This rank's share arrives in a scrambled order and is put back in canonical order.
    std::vector<Rollout> share;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (int(i % size_t(size)) == rank) share.push_back(batch[i]);
    }
    std::shuffle(share.begin(), share.end(), std::mt19937(unsigned(rank * 7 + step)));
    std::sort(share.begin(), share.end(), canonical_less);
    optimize_on_rollouts(single, single_opt, batch, settings);
    optimize_on_rollouts(parallel, parallel_opt, share, settings, hooks);
  }
  test::expect_close(parallel.parameters(), single.parameters(), size_t(single.parameter_count()),
                     "parameters after 2 steps", 1e-5, 1e-3);
  // Every learner holds bit-identical weights (the allreduce hands every rank the same sum).
  std::vector<float> root(parallel.parameters(),
                          parallel.parameters() + parallel.parameter_count());
  MPI_Bcast(root.data(), int(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  EXPECT_EQ(std::memcmp(root.data(), parallel.parameters(), root.size() * sizeof(float)), 0);
  free_hierarchical(learners);
}

}  // namespace
}  // namespace rlf
