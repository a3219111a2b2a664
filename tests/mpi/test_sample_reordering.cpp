// Data reordering across data-parallel ranks (src/app/sample_reordering.h): a step whose samples
// were moved to the greedy assignment's ranks trains every sample exactly once and sums to the
// gradient and loss of the in-order step and of one rank on the whole batch; the samples cross
// the wire as DistQueue packs them, counted by Links.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "mpi_comm/hierarchical_collectives.h"
#include "mpi_comm/topology.h"
#include "src/app/sample_reordering.h"
#include "src/rl/policy_loss.h"
#include "src/rl/task.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/rl_batch.h"
#include "tests/test_util.h"
#include "tests/tiny_policy.h"

namespace rlf {
namespace {

constexpr int kMicroBatch = 3;

// The global batch with a heavy tail at its start: every sample after the first quarter keeps
// only its first response token, so the first rank's contiguous share holds the long samples.
std::vector<Rollout> skewed_batch(Transformer<float>& policy, const Task& task, int step) {
  std::vector<Rollout> batch = test::global_rl_batch(policy, task, step);
  for (size_t i = batch.size() / 4; i < batch.size(); ++i) {
    batch[i].response.resize(std::min<size_t>(1, batch[i].response.size()));
    batch[i].behaviour_logp.resize(batch[i].response.size());
  }
  return batch;
}

struct Gradient {
  std::vector<float> values;
  double loss = 0;
};

// The gradient of the whole batch's loss from `mine` (this rank's samples): the normalizer and
// the gradient summed over `learners` (one rank: learners of size 1).
Gradient summed_gradient(Transformer<float>& model, const std::vector<Rollout>& mine,
                         const HierarchicalComm& learners, Links& links) {
  double tokens = 0;
  for (const Rollout& r : mine) tokens += double(r.response.size());
  MPI_Allreduce(MPI_IN_PLACE, &tokens, 1, MPI_DOUBLE, MPI_SUM, learners.comm);
  model.zero_gradients();
  Gradient g;
  for (size_t begin = 0; begin < mine.size(); begin += kMicroBatch) {
    std::vector<const Rollout*> micro;
    for (size_t i = begin; i < std::min(mine.size(), begin + kMicroBatch); ++i)
      micro.push_back(&mine[i]);
    g.loss += accumulate_policy_gradient(model, micro, tokens, 1.0f, PpoSettings{}, 0.0f).loss;
  }
  MPI_Allreduce(MPI_IN_PLACE, &g.loss, 1, MPI_DOUBLE, MPI_SUM, learners.comm);
  allreduce_sum(model.gradients(), model.parameter_count(), learners, links);
  g.values.assign(model.gradients(), model.gradients() + model.parameter_count());
  return g;
}

std::vector<int64_t> all_ids(const std::vector<Rollout>& mine) {
  std::vector<int64_t> ids;
  for (const Rollout& r : mine) ids.push_back(r.sample_id);
  const int count = int(ids.size());
  const int size = test::world_size();
  std::vector<int> counts(static_cast<size_t>(size)), offsets(static_cast<size_t>(size), 0);
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 1; r < size; ++r)
    offsets[size_t(r)] = offsets[size_t(r) - 1] + counts[size_t(r) - 1];
  std::vector<int64_t> all(size_t(offsets.back() + counts.back()));
  MPI_Allgatherv(ids.data(), count, MPI_INT64_T, all.data(), counts.data(), offsets.data(),
                 MPI_INT64_T, MPI_COMM_WORLD);
  return all;
}

void check_reordered_step(ReorderCosts costs) {
  const int rank = test::world_rank(), size = test::world_size();
  const std::unique_ptr<Task> task = make_task({"sort", 1, {}});
  Links links(test::virtual_node_list(size, 2), LinkEmulation{});
  HierarchicalComm learners = make_hierarchical(MPI_COMM_WORLD, links);
  HierarchicalComm alone = make_hierarchical(MPI_COMM_SELF, links);
  const ModelConfig config = test::tiny_policy_config_without_aux_loss();
  Arena device("reordering", 64 << 20);
  Transformer<float> model(config, cpu_ops(), device, true);
  model.initialize(5);
  TraceRecorder trace(MPI_COMM_WORLD);
  SampleReordering reordering(costs, config, MPI_COMM_WORLD, links, trace, 1);
  const std::vector<Rollout> batch = skewed_batch(model, *task, 0);
  ASSERT_EQ(batch.size() % size_t(size), 0u);
  const size_t share = batch.size() / size_t(size);

  // The measured model is fitted from earlier steps' times: synthetic steps whose times follow a
  // known quadratic cost (so the fit is determined and the same on every rank).
  for (int step = 1; costs == ReorderCosts::Measured && step <= 4; ++step) {
    // Steps of different shapes: the whole share, its first third (the long samples on rank 0),
    // its last third, the whole share.
    std::vector<Rollout> mine;
    for (size_t i = 0; i < share; ++i) {
      if ((step == 2 && i >= share / 3) || (step == 3 && i < share - share / 3)) continue;
      mine.push_back(batch[share * size_t(rank) + i]);
    }
    mine = reordering.reorder(std::move(mine), test::kBatchGroupSize, step);
    double seconds = 0;
    for (const Rollout& r : mine) {
      const double L = double(r.prompt.size() + r.response.size());
      seconds += 1e-4 + 1e-6 * L + 1e-7 * L * L;
    }
    const std::string line = reordering.end_of_step(step, seconds);
    if (step == 4) {
      EXPECT_NE(line.find("(measured costs)"), std::string::npos) << line;
    }
  }

  const Gradient whole = summed_gradient(model, batch, alone, links);
  const std::vector<Rollout> in_order(batch.begin() + std::ptrdiff_t(share * size_t(rank)),
                                      batch.begin() + std::ptrdiff_t(share * size_t(rank + 1)));
  const Gradient ordered = summed_gradient(model, in_order, learners, links);
  const uint64_t bytes_before = test::link_bytes(links);
  const std::vector<Rollout> reordered =
      reordering.reorder(in_order, test::kBatchGroupSize, /*version=*/0);
  const uint64_t moved_bytes = test::link_bytes(links) - bytes_before;
  const Gradient moved = summed_gradient(model, reordered, learners, links);

  // Every sample exactly once, in sample-id order on each rank.
  std::vector<int64_t> ids = all_ids(reordered), want;
  for (const Rollout& r : batch) want.push_back(r.sample_id);
  std::sort(ids.begin(), ids.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(ids, want);
  for (size_t i = 1; i < reordered.size(); ++i) {
    EXPECT_LT(reordered[i - 1].sample_id, reordered[i].sample_id);
  }
  // The samples that moved arrive intact (tokens, log-probs, advantages as the queue carries them).
  for (const Rollout& r : reordered) {
    const Rollout& original = *std::find_if(
        batch.begin(), batch.end(), [&](const Rollout& b) { return b.sample_id == r.sample_id; });
    EXPECT_EQ(r.prompt, original.prompt);
    EXPECT_EQ(r.response, original.response);
    EXPECT_EQ(r.behaviour_logp, original.behaviour_logp);
    EXPECT_FLOAT_EQ(float(r.advantage), float(original.advantage));
  }
  // With several ranks the long samples of rank 0 are spread: something moved, and was counted.
  unsigned long long total_moved = moved_bytes;
  MPI_Allreduce(MPI_IN_PLACE, &total_moved, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (size > 1) {
    EXPECT_GT(total_moved, 0u);
  } else {
    EXPECT_EQ(total_moved, 0u);
  }
  test::expect_close(moved.values, ordered.values, "reordered vs in-order gradient", 1e-6, 1e-4);
  test::expect_close(moved.values, whole.values, "reordered vs one-rank gradient", 1e-6, 1e-4);
  EXPECT_NEAR(moved.loss, ordered.loss, 1e-6 + 1e-5 * std::abs(ordered.loss));
  EXPECT_NEAR(moved.loss, whole.loss, 1e-6 + 1e-5 * std::abs(whole.loss));
  free_hierarchical(alone);
  free_hierarchical(learners);
}

TEST(SampleReordering, CountedStepKeepsTheBatchGradientAndLoss) {
  check_reordered_step(ReorderCosts::Counted);
}

TEST(SampleReordering, MeasuredStepKeepsTheBatchGradientAndLoss) {
  check_reordered_step(ReorderCosts::Measured);
}

TEST(SampleReordering, CountedCostsGrowWithTheModelsFlops) {
  ModelConfig config = test::tiny_policy_config();
  const SampleCostModel base = counted_sample_cost_model(config);
  EXPECT_EQ(base.fixed, 0);
  EXPECT_GT(base.per_token, 0);
  EXPECT_GT(base.per_token_squared, 0);
  // Attention's share is quadratic in the sample: doubling d_model doubles it.
  config.d_model *= 2;
  config.validate("test");
  EXPECT_DOUBLE_EQ(counted_sample_cost_model(config).per_token_squared, 2 * base.per_token_squared);
}

}  // namespace
}  // namespace rlf
