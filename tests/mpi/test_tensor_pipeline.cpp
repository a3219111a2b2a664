// Tensor parallelism inside every pipeline stage (TP x PP x DP, train --tensor-parallel T
// --pipeline-parallel P) at every world size the suite runs: each rank's seeded stage is exactly
// its TP slice of its stage of the single-rank initialization; on fresh random micro-batches the
// pipeline step's loss and every gradient, gathered over the TP group and the pipeline (the layout
// switch run on the gradient buffer) and summed over the data-parallel replicas, equal the
// single-rank model's; the layout switch to data-parallel generation assembles exactly the
// single-rank model, moves exactly the bytes a rank lacks and leaves the slice bit for bit as it
// was; AdamW over the slices, its clipping norm counting every element once, takes the
// single-rank model's clipped steps; also with uneven chunks (stage balancing's boundaries, as
// `train --pipeline-balance` cuts them, TP 1 and 2). Shapes that do not fit stop every rank with
// the same error.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "mpi_comm/links.h"
#include "src/balance/stage_balance.h"
#include "src/model/optimizer.h"
#include "src/model/pipeline_stage.h"
#include "src/model/tensor_parallel.h"
#include "src/runtime/pipeline_groups.h"
#include "src/runtime/pipeline_layout_switch.h"
#include "src/runtime/pipeline_step.h"
#include "tests/micro_model_config.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/pipeline_replica_step.h"
#include "tests/mpi/sharded_adamw_steps.h"
#include "tests/pipeline_batches.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

struct Case {
  int tp, stages, virtual_stages, micro_batches;
  // Layers of each chunk in virtual-stage order (stage balancing); empty: 2 per chunk.
  std::vector<int> layers_per_chunk = {};
};

std::string case_name(const Case& c) {
  std::string name = "TP " + std::to_string(c.tp) + " x PP " + std::to_string(c.stages) +
                     " v=" + std::to_string(c.virtual_stages) +
                     " m=" + std::to_string(c.micro_batches);
  if (!c.layers_per_chunk.empty()) name += " layers per chunk";
  for (int layers : c.layers_per_chunk) {
    name += ' ';
    name += std::to_string(layers);
  }
  return name;
}

// The chunk boundaries of an uneven case (empty: PipelineGroups' equal chunks).
std::vector<int> boundaries_of(const Case& c) {
  return c.layers_per_chunk.empty() ? std::vector<int>{} : chunk_boundaries(c.layers_per_chunk);
}

// TP x PP x DP layouts of every world size the suite runs (DP = world / (TP x PP)).
std::vector<Case> cases_for(int world) {
  switch (world) {
    case 1:
      return {{1, 1, 2, 2}, {1, 1, 2, 2, {3, 1}}};
    case 2:
      return {{2, 1, 1, 2},
              {1, 2, 1, 2},
              {2, 1, 2, 2},
              {1, 2, 1, 2, {3, 1}},
              {1, 2, 2, 2, {1, 3, 2, 1}}};
    case 4:
      return {{2, 2, 1, 2},
              {2, 2, 2, 4},
              {2, 1, 1, 3},
              {2, 2, 1, 3},
              {1, 4, 1, 4, {2, 1, 1, 3}},
              {2, 2, 1, 2, {1, 3}},
              {1, 2, 1, 3, {3, 2}}};
    case 6:
      return {{2, 3, 1, 3},
              {3, 2, 1, 2},
              {2, 1, 2, 2},
              {3, 2, 2, 4},
              {1, 3, 1, 3, {1, 2, 3}},
              {2, 3, 1, 3, {2, 1, 1}},
              {1, 2, 2, 2, {2, 1, 1, 3}}};
    default:
      return {};
  }
}

// 2 p v layers, or the uneven chunks' sum.
ModelConfig model_for(const Case& c) {
  const std::vector<int> boundaries = boundaries_of(c);
  return test::tensor_parallel_micro_config(boundaries.empty() ? 2 * c.stages * c.virtual_stages
                                                               : boundaries.back());
}

// The layers of one pipeline stage, TP-sliced, over the groups of a case.
struct TensorPipelineRank {
  Links links;
  TensorParallel tp;
  PipelineGroups groups;
  ParameterLayout stage_whole;  // this rank's stage, whole tensors

  TensorPipelineRank(const Case& c, const ModelConfig& config)
      : links(test::virtual_node_list(test::world_size(), 1), {}),
        tp(MPI_COMM_WORLD, c.tp, /*attention_only=*/false, config, links),
        groups(MPI_COMM_WORLD, {c.stages, c.micro_batches, c.virtual_stages}, config, links, &tp,
               /*expert_parallel=*/1, boundaries_of(c)),
        stage_whole(groups.stage_layout(groups.stage())) {}

  Transformer<float> make_stage(const ModelConfig& config, Arena& device) const {
    return Transformer<float>(config, cpu_ops(), device, /*with_gradients=*/true, ExpertShard{},
                              stage_layer_shard(groups.chunks(groups.stage()), config.n_layers),
                              &tp);
  }

  // This rank's slice of its stage of a whole-model buffer.
  std::vector<float> own_part(const float* whole, const ParameterLayout& whole_layout,
                              const ParameterLayout& slice_layout) const {
    std::vector<float> stage(size_t(stage_whole.total()), 0.0f),
        slice(size_t(slice_layout.total()));
    copy_shared_tensors(whole, whole_layout, stage.data(), stage_whole);
    slice_parameters(stage.data(), stage_whole, slice.data(), slice_layout);
    return slice;
  }
};

void check_step(const Case& c) {
  SCOPED_TRACE(case_name(c));
  const int world = test::world_size();
  const ModelConfig config = model_for(c);
  const uint64_t seed = test::seed_for(case_name(c), world);
  TensorPipelineRank rank(c, config);
  const PipelineGroups& groups = rank.groups;
  ASSERT_EQ(groups.model_parallel().size(), c.tp * c.stages);
  ASSERT_EQ(groups.replicas(), world / (c.tp * c.stages));
  if (!c.layers_per_chunk.empty()) {
    // Chunk k of this stage is virtual stage k p + stage: that entry of the layer list.
    const std::vector<int> b = boundaries_of(c);
    const std::vector<LayerRange> chunks = groups.chunks(groups.stage());
    ASSERT_EQ(int(chunks.size()), c.virtual_stages);
    for (int k = 0; k < c.virtual_stages; ++k) {
      const size_t s = size_t(k * c.stages + groups.stage());
      EXPECT_EQ(chunks[size_t(k)].first, b[s]) << "chunk " << k;
      EXPECT_EQ(chunks[size_t(k)].last, b[s + 1]) << "chunk " << k;
    }
  }
  Arena device("stage", 16 << 20);
  Transformer<float> stage = rank.make_stage(config, device);
  stage.initialize(seed);
  Arena ref_device("reference", 64 << 20);
  Transformer<float> reference(config, cpu_ops(), ref_device, /*with_gradients=*/true);
  reference.initialize(seed);
  // The seeded slice is exactly its part of the single-rank initialization.
  const std::vector<float> init =
      rank.own_part(reference.parameters(), reference.layout(), stage.layout());
  ASSERT_EQ(std::memcmp(init.data(), stage.parameters(), init.size() * sizeof(float)), 0);

  // Every replica's micro-batches (the same on every rank); the single-rank model runs them all.
  const test::PipelineStepBeside step =
      test::pipeline_step_beside_reference(stage, reference, groups, rank.links, seed);
  MPI_Allreduce(MPI_IN_PLACE, stage.gradients(), int(stage.parameter_count()), MPI_FLOAT, MPI_SUM,
                groups.data_parallel().comm);
  EXPECT_NEAR(step.loss, step.reference_loss, 1e-6 + 1e-5 * std::abs(step.reference_loss));
  // The gradient of every tensor, gathered over the TP group and the pipeline: the whole model's,
  // up to the float reassociation of the TP partial sums (a few elements of 1e-4 differ by 1e-6
  // at TP 2 x PP 2; a misplaced slice or layer is off by the gradient's whole size).
  std::vector<float> gradient(size_t(reference.parameter_count()));
  gather_pipeline_model(stage.gradients(), groups, gradient.data(), reference.layout());
  for (const ParameterTensor& t : reference.layout().tensors()) {
    const float *got = gradient.data() + t.offset, *want = reference.gradients() + t.offset;
    test::expect_close(got, want, size_t(t.numel), "gradient of " + t.name, 1e-5, 1e-3);
    EXPECT_LT(test::nmse(got, want, size_t(t.numel)), 1e-8) << "gradient of " << t.name;
  }

  // The layout switch to data-parallel generation, on the parameters.
  const std::vector<float> before(stage.parameters(), stage.parameters() + stage.parameter_count());
  std::vector<float> whole(size_t(reference.parameter_count()), 7.0f);
  const uint64_t sent_before = test::link_bytes(rank.links);
  const uint64_t received =
      gather_pipeline_model(stage.parameters(), groups, whole.data(), reference.layout());
  int64_t cut = 0;
  for (const ParameterRange& r : tensor_parallel_ranges(stage.layout())) cut += r.count;
  const uint64_t own_stage = uint64_t(rank.stage_whole.total()) * sizeof(float);
  uint64_t other_stages = 0;
  for (int s = 0; s < c.stages; ++s) {
    if (s != groups.stage())
      other_stages += uint64_t(groups.stage_layout(s).total()) * sizeof(float);
  }
  EXPECT_EQ(received, other_stages + uint64_t(cut) * sizeof(float) * uint64_t(c.tp - 1));
  EXPECT_EQ(
      test::link_bytes(rank.links) - sent_before,
      own_stage * uint64_t(c.stages - 1) + uint64_t(cut) * sizeof(float) * uint64_t(c.tp - 1));
  EXPECT_EQ(std::memcmp(whole.data(), reference.parameters(), whole.size() * sizeof(float)), 0)
      << "the gathered model is not the single-rank model";
  EXPECT_EQ(std::memcmp(stage.parameters(), before.data(), before.size() * sizeof(float)), 0)
      << "the layout switch changed the slice";
  {
    // Onto the writer alone (checkpoints, the saved model): TP rank 0 of the first stage, one rank
    // per model replica, assembles the single-rank model; no other rank is handed a buffer.
    const bool writer = assembles_pipeline_model(groups);
    int writers = writer ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &writers, 1, MPI_INT, MPI_SUM, groups.model_parallel().comm);
    EXPECT_EQ(writers, 1);
    std::vector<float> onto_writer(writer ? whole.size() : 0, 7.0f);
    const uint64_t writer_received = gather_pipeline_model(
        stage.parameters(), groups, writer ? onto_writer.data() : nullptr, reference.layout(), 0);
    if (writer) {
      EXPECT_EQ(std::memcmp(onto_writer.data(), reference.parameters(),
                            onto_writer.size() * sizeof(float)),
                0)
          << "the model gathered onto the writer is not the single-rank model";
      EXPECT_EQ(writer_received, other_stages + uint64_t(cut) * sizeof(float) * uint64_t(c.tp - 1));
    } else {
      // (TP rank 0 of another stage received its TP mates' slices; nothing else did.)
      const bool tp_zero = groups.tensor_parallel() && groups.tensor_parallel()->rank() == 0;
      EXPECT_EQ(writer_received,
                tp_zero ? uint64_t(cut) * sizeof(float) * uint64_t(c.tp - 1) : uint64_t(0));
    }
  }
}

void check_adamw(const Case& c) {
  SCOPED_TRACE("AdamW " + case_name(c));
  const ModelConfig config = model_for(c);
  const uint64_t seed = test::seed_for("adamw " + case_name(c), test::world_size());
  TensorPipelineRank rank(c, config);
  Arena device("stage", 16 << 20), reference_device("reference", 16 << 20);
  Transformer<float> stage = rank.make_stage(config, device);
  Transformer<float> reference(config, cpu_ops(), reference_device, true);
  stage.initialize(seed);
  reference.initialize(seed);
  test::expect_single_rank_clipped_steps(
      stage, rank.groups.optimizer_shard(stage.layout()), reference,
      [&](const float* whole) { return rank.own_part(whole, reference.layout(), stage.layout()); },
      seed);
}

TEST(TensorPipeline, StepAndLayoutSwitchEqualTheSingleRankModel) {
  const std::vector<Case> cases = cases_for(test::world_size());
  if (cases.empty()) GTEST_SKIP() << "no TP x PP case at this world size";
  for (const Case& c : cases) {
    check_step(c);
    ASSERT_TRUE(test::on_every_rank(!::testing::Test::HasFailure())) << case_name(c);
  }
}

TEST(TensorPipeline, AdamWOverSlicesTakesTheSingleRankClippedSteps) {
  const std::vector<Case> cases = cases_for(test::world_size());
  if (cases.empty()) GTEST_SKIP() << "no TP x PP case at this world size";
  for (const Case& c : cases) {
    check_adamw(c);
    ASSERT_TRUE(test::on_every_rank(!::testing::Test::HasFailure())) << case_name(c);
  }
}

TEST(TensorPipeline, ShapesThatDoNotFitStopEveryRank) {
  const int world = test::world_size();
  if (world % 2 != 0) GTEST_SKIP() << "needs TP 2";
  Links links(test::virtual_node_list(world, 1), {});
  ModelConfig config = model_for({2, 1, 1, 1});
  config.n_layers = 3;
  TensorParallel tp(MPI_COMM_WORLD, 2, false, config, links);
  // P x V not dividing the layers.
  test::expect_config_error_everywhere(
      [&] {
        PipelineGroups(MPI_COMM_WORLD, {1, 1, 2}, config, links, &tp);
      },
      "--pipeline-parallel 1 x --virtual-stages 2 = 2 model chunks must divide the model's 3");
  // P not dividing the TP replicas (world / 2).
  test::expect_config_error_everywhere(
      [&] {
        PipelineGroups(MPI_COMM_WORLD, {world / 2 + 1, world / 2 + 1, 1}, config, links, &tp);
      },
      "--pipeline-parallel " + std::to_string(world / 2 + 1) + " must divide");
}

}  // namespace
}  // namespace rlf
