// Pipeline parallelism over MPI at every world size the suite runs: 1F1B and interleaved 1F1B
// (PP 2 on 2 ranks; PP 4, and PP 2 with v = 2 as two data-parallel pipelines, on 4; PP 3 and
// PP 6 on 6; one rank running v = 2 chunks through messages to itself). On fresh random
// micro-batches the step's loss and the gradient of every tensor each rank stores equal the
// single-rank model's, gradients summed over the data-parallel pipelines; every activation and
// gradient crosses exactly once (byte counters); each rank holds at most the schedule's bound of
// micro-batch chunks. Passes paced to a PassFloor take at least the floor and leave the gradients'
// bits alone. Bad shapes stop every rank with the same ConfigError.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "mpi_comm/links.h"
#include "src/balance/stage_balance.h"
#include "src/model/pipeline_stage.h"
#include "src/runtime/pipeline_schedule.h"
#include "src/runtime/pipeline_step.h"
#include "tests/micro_model_config.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/pipeline_batches.h"

namespace rlf {
namespace {

struct Case {
  int stages, virtual_stages, micro_batches, layers;
  std::vector<int> boundaries;  // empty: uniform
};

std::string case_name(const Case& c) {
  return "PP " + std::to_string(c.stages) + " v=" + std::to_string(c.virtual_stages) +
         " m=" + std::to_string(c.micro_batches) + " layers=" + std::to_string(c.layers) +
         (c.boundaries.empty() ? "" : " uneven");
}

std::vector<Case> cases_for(int world) {
  switch (world) {
    case 1:
      return {{1, 1, 3, 2, {}}, {1, 2, 2, 4, {}}};
    case 2:
      return {{2, 1, 4, 4, {}}, {2, 1, 1, 2, {}},        {2, 2, 2, 4, {}},
              {2, 2, 4, 8, {}}, {2, 1, 3, 5, {0, 3, 5}}, {1, 1, 2, 2, {}}};
    case 4:
      return {{4, 1, 4, 4, {}},
              {4, 1, 2, 8, {}},
              {4, 2, 4, 8, {}},
              {2, 2, 4, 4, {}},
              {2, 1, 3, 6, {0, 2, 6}}};
    case 6:
      return {{3, 1, 3, 6, {}}, {3, 2, 3, 6, {}}, {6, 1, 6, 6, {}}, {2, 2, 2, 4, {}}};
    default:
      return {};
  }
}

void check_case(const Case& c) {
  const int world = test::world_size(), rank = test::world_rank();
  SCOPED_TRACE(case_name(c));
  const PipelineShape shape{c.stages, c.micro_batches, c.virtual_stages};
  validate_pipeline(shape, c.layers, world, !c.boundaries.empty());
  const int replicas = world / c.stages, stage_rank = rank % c.stages, replica = rank / c.stages;
  ModelConfig config = test::micro_config();
  config.n_layers = c.layers;
  const float aux_weight = config.aux_loss_coef;
  const uint64_t seed = test::seed_for(case_name(c), world);

  // Every replica's micro-batches, the same on every rank; the single-rank model runs them all.
  const auto all =
      test::random_micro_batches<float>(c.micro_batches * replicas, config.vocab_size, 9, seed);
  const std::vector<PipelineMicroBatch<float>> mine(all.begin() + replica * c.micro_batches,
                                                    all.begin() + (replica + 1) * c.micro_batches);
  Arena ref_device("reference", 64 << 20);
  Transformer<float> reference(config, cpu_ops(), ref_device, true);
  reference.initialize(seed);
  const double want_loss = test::reference_step(reference, all, aux_weight);

  MPI_Comm pipeline, data_parallel;
  MPI_Comm_split(MPI_COMM_WORLD, replica, rank, &pipeline);
  MPI_Comm_split(MPI_COMM_WORLD, stage_rank, rank, &data_parallel);
  const std::vector<int> boundaries =
      c.boundaries.empty() ? uniform_boundaries(c.layers, shape.chunks()) : c.boundaries;
  Arena device("stage", 16 << 20);
  PipelineStage<float> stage(config, cpu_ops(), device,
                             pipeline_rank_chunks(shape, stage_rank, boundaries), 8 << 20);
  stage.model().initialize(seed);
  stage.model().zero_gradients();
  Links links(test::virtual_node_list(world, 1), {});
  const PipelineStepStats stats =
      run_pipeline_step(stage, shape, mine, aux_weight, pipeline, links);
  MPI_Allreduce(MPI_IN_PLACE, stage.model().gradients(), int(stage.model().parameter_count()),
                MPI_FLOAT, MPI_SUM, data_parallel);
  double loss = stats.loss;
  MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, data_parallel);

  EXPECT_NEAR(loss, want_loss, 1e-6 + 1e-5 * std::abs(want_loss));
  test::expect_stage_gradients(stage.model(), reference, 1e-6, 1e-5);
  EXPECT_EQ(stats.in_flight_peak, in_flight_bound(shape, stage_rank));
  // Each micro-batch's rows cross every boundary between virtual stages twice (activation
  // forward, gradient backward).
  uint64_t want_bytes = 0;
  for (const auto& b : mine) {
    want_bytes += 2 * uint64_t(shape.chunks() - 1) * uint64_t(b.token_count()) *
                  uint64_t(config.d_model) * sizeof(float);
  }
  uint64_t bytes = stats.bytes_sent,
           counted = links.counters().bytes[0] + links.counters().bytes[1];
  MPI_Allreduce(MPI_IN_PLACE, &bytes, 1, MPI_UINT64_T, MPI_SUM, pipeline);
  MPI_Allreduce(MPI_IN_PLACE, &counted, 1, MPI_UINT64_T, MPI_SUM, pipeline);
  EXPECT_EQ(bytes, want_bytes);
  EXPECT_EQ(counted, want_bytes);
  EXPECT_GT(stats.wall_seconds, 0);
  EXPECT_GE(stats.wait_seconds, 0);
  MPI_Comm_free(&pipeline);
  MPI_Comm_free(&data_parallel);
}

TEST(Pipeline, LossAndGradientsEqualTheSingleRankModel) {
  const std::vector<Case> cases = cases_for(test::world_size());
  if (cases.empty()) GTEST_SKIP() << "no pipeline case at this world size";
  for (const Case& c : cases) {
    check_case(c);
    ASSERT_TRUE(test::on_every_rank(!::testing::Test::HasFailure())) << case_name(c);
  }
}

// bench pipeline's equal stages: every pass spins up to its floor, so each chunk's m forwards
// take at least m floors (and the backwards theirs); the arithmetic is untouched, so the
// gradients are the unpaced step's bits. A floor below any pass's work counts every pass as an
// overrun. Pairs are not paced.
TEST(Pipeline, PacedPassesTakeTheirFloorAndKeepTheGradientsBits) {
  const int world = test::world_size(), rank = test::world_rank();
  const PipelineShape shape{world, 2 * world, 2};
  ModelConfig config = test::micro_config();
  config.n_layers = shape.chunks();
  const uint64_t seed = test::seed_for("paced passes", world);
  const auto batches =
      test::random_micro_batches<float>(shape.micro_batches, config.vocab_size, 7, seed);
  Arena device("stage", 16 << 20);
  PipelineStage<float> stage(
      config, cpu_ops(), device,
      pipeline_rank_chunks(shape, rank, uniform_boundaries(config.n_layers, shape.chunks())),
      8 << 20);
  stage.model().initialize(seed);
  Links links(test::virtual_node_list(world, 1), {});
  const float aux = config.aux_loss_coef;
  const size_t n = size_t(stage.model().parameter_count());
  auto step = [&](PassFloor floor) {
    stage.model().zero_gradients();
    const PipelineStepStats stats =
        run_pipeline_step(stage, shape, batches, aux, MPI_COMM_WORLD, links, false, floor);
    return std::pair{stats,
                     std::vector<float>(stage.model().gradients(), stage.model().gradients() + n)};
  };
  const auto [plain, plain_gradients] = step({});
  EXPECT_EQ(plain.floor_overruns, 0);
  const PassFloor floor{2e-3, 3e-3};
  const auto [paced, paced_gradients] = step(floor);
  EXPECT_EQ(std::memcmp(paced_gradients.data(), plain_gradients.data(), n * sizeof(float)), 0);
  EXPECT_EQ(paced.loss, plain.loss);
  for (int k = 0; k < shape.virtual_stages; ++k) {
    EXPECT_GE(paced.forward_seconds[size_t(k)], shape.micro_batches * floor.forward) << k;
    EXPECT_GE(paced.backward_seconds[size_t(k)], shape.micro_batches * floor.backward) << k;
  }
  EXPECT_GE(paced.compute_seconds,
            shape.micro_batches * shape.virtual_stages * (floor.forward + floor.backward));
  const auto [under, under_gradients] = step({1e-9, 1e-9});
  EXPECT_EQ(under.floor_overruns, 2 * shape.micro_batches * shape.virtual_stages);
  EXPECT_THROW(run_pipeline_step(stage, shape, batches, aux, MPI_COMM_WORLD, links, true, floor),
               std::invalid_argument);
}

TEST(Pipeline, BadShapesAreTheSameConfigErrorOnEveryRank) {
  const int world = test::world_size();
  test::expect_config_error_everywhere(
      [&] {
        validate_pipeline({1, 4, 3}, 8, world);
      },
      "--virtual-stages 3");
  test::expect_config_error_everywhere(
      [&] {
        validate_pipeline({world + 1, world + 1, 1}, 2 * (world + 1), world);
      },
      "--pipeline-parallel " + std::to_string(world + 1));
  test::expect_config_error_everywhere(
      [&] {
        validate_pipeline({2, 1, 2}, 8, 2 * world);
      },
      "--micro-batches 1");
}

}  // namespace
}  // namespace rlf
