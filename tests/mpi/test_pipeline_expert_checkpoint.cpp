// Checkpoints of PP x EP training (train --pipeline-parallel P --expert-parallel E, with EP and
// PP alone for comparison) at every world size the suite runs: after every EP group moved its
// layers' experts to other slots (a placement per layer, as the rebalancer leaves them), the file
// still holds exactly the single-rank state with the experts by id (the stages of the first EP
// replica's pipelines write it together through parallel HDF5, none sending its part to
// another), and loading it
// gives every rank exactly its part in the starting placement: its stage's layers, its EP rank's
// experts, AdamW's moments and the KL reference. (PP x EP needs 4 ranks; 1 and 2 run the layouts
// it combines.)
#include <gtest/gtest.h>
#include <mpi.h>

#include <array>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "mpi_comm/links.h"
#include "src/app/train_checkpoints.h"
#include "src/io/checkpoint.h"
#include "src/io/run_directory.h"
#include "src/model/optimizer.h"
#include "src/runtime/pipeline_groups.h"
#include "src/runtime/pipeline_layout_switch.h"
#include "src/runtime/role_expert_parallel.h"
#include "tests/micro_model_config.h"
#include "tests/mpi/checkpoint_state.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/pipeline_expert_cases.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

using Case = test::PipelineExpertCase;

// PP x EP x DP layouts (DP = world / PP, a multiple of EP) of every world size the suite runs,
// each with P micro-batches (unused: no step runs), and uneven chunks (stage balancing).
std::vector<Case> cases_for(int world) {
  switch (world) {
    case 1:
      return {{1, 1, 1, 1}};
    case 2:
      return {{2, 1, 1, 2}, {1, 2, 1, 1}, {2, 1, 1, 2, {1, 3}}};
    case 4:
      return {{2, 2, 1, 2}, {2, 2, 2, 2}, {1, 2, 1, 1}, {2, 2, 1, 2, {3, 1}}};
    case 6:
      return {{3, 2, 1, 3}, {2, 3, 1, 2}, {2, 3, 2, 2}, {3, 2, 1, 3, {1, 1, 2}}};
    default:
      return {};
  }
}

// A rank's training state (its part of the parameters, AdamW's moments and the reference), or
// the single-rank one.
struct State {
  Transformer<float> model, reference;
  AdamW<float> adamw;

  State(const ModelConfig& config, Arena& device, const ExpertShard& experts,
        const LayerShard& layers)
      : model(config, cpu_ops(), device, /*with_gradients=*/true, experts, layers),
        reference(config, cpu_ops(), device, /*with_gradients=*/false, experts, layers),
        adamw(model, AdamWHyper{}, 1.0f) {}

  TrainingState training() { return {&model, &adamw, &reference}; }
  // In checkpoint order: parameters, moments, reference.
  std::array<float*, 4> buffers() {
    return {model.parameters(), adamw.first_moment(), adamw.second_moment(),
            reference.parameters()};
  }
};

// Layer l's experts rotated by l + 1 slots: every layer its own placement, experts on other
// EP ranks than their starting ones.
std::vector<std::vector<int>> rotated_placement(const ModelConfig& config) {
  std::vector<std::vector<int>> slot_of(size_t(config.n_layers));
  for (int l = 0; l < config.n_layers; ++l)
    for (int e = 0; e < config.n_experts; ++e)
      slot_of[size_t(l)].push_back((e + l + 1) % config.n_experts);
  return slot_of;
}

void check_checkpoint(const Case& c) {
  SCOPED_TRACE(test::case_name(c));
  const int world = test::world_size();
  const ModelConfig config = test::pipeline_expert_model(c);
  const uint64_t seed = test::seed_for("pipeline expert checkpoint " + test::case_name(c), world);
  Links links(test::virtual_node_list(world, 1), {});
  // As train builds them: no pipelines at PP 1, EP over the stage's data-parallel group.
  std::unique_ptr<PipelineGroups> pipeline;
  if (c.stages > 1) {
    pipeline = std::make_unique<PipelineGroups>(
        MPI_COMM_WORLD, PipelineShape{c.stages, c.micro_batches, c.virtual_stages}, config, links,
        nullptr, c.ep, test::case_boundaries(c));
  }
  HierarchicalComm world_comm = make_hierarchical(MPI_COMM_WORLD, links);
  std::unique_ptr<RoleExpertParallel> ep;
  if (c.ep > 1) {
    ep = std::make_unique<RoleExpertParallel>(pipeline ? pipeline->data_parallel() : world_comm,
                                              links, config.n_experts, c.ep, DispatchMode::Flat);
  }
  const LayerShard layers =
      pipeline ? stage_layer_shard(pipeline->chunks(pipeline->stage()), config.n_layers)
               : LayerShard{};
  const ExpertShard experts = ep ? ep->shard() : ExpertShard{};
  if (pipeline) {
    ASSERT_EQ(pipeline->expert_shard().first, experts.first);
    ASSERT_EQ(pipeline->expert_shard().count, experts.count);
  }
  Arena device("part", 32 << 20), whole_device("whole", 32 << 20);
  // The single-rank state: parameters, AdamW's moments and the reference, all different.
  State whole(config, whole_device, ExpertShard{}, LayerShard{});
  whole.model.initialize(seed);
  whole.reference.initialize(seed + 1);
  std::mt19937 gen(static_cast<uint32_t>(seed));
  test::fill_tensors(whole.adamw.first_moment(), whole.model.layout(), gen, false);
  test::fill_tensors(whole.adamw.second_moment(), whole.model.layout(), gen, true);
  // Each rank its part of it (its stage's layers, its EP rank's experts), kept as loading must
  // give it back.
  State mine(config, device, experts, layers);
  const ParameterLayout& layout = mine.model.layout();
  std::array<std::vector<float>, 4> own_part;
  for (size_t b = 0; b < 4; ++b) {
    copy_shared_tensors(whole.buffers()[b], whole.model.layout(), mine.buffers()[b], layout);
    own_part[b].assign(mine.buffers()[b], mine.buffers()[b] + layout.total());
  }
  if (ep) {
    // Every layer's experts elsewhere, with their moments and reference weights: the rank's
    // slots no longer hold its starting experts.
    ep->attach(mine.model);
    const std::array<float*, 4> b = mine.buffers();
    ep->migrate_experts(rotated_placement(config), layout, {b[0], b[1], b[2], b[3]});
    bool moved = false;
    for (size_t i = 0; i < 4; ++i)
      moved = moved || !test::same_tensors(mine.buffers()[i], own_part[i].data(), layout);
    EXPECT_TRUE(test::on_every_rank(moved)) << "the placement moved no expert";
  }

  RunOptions run;
  run.run_dir = test::shared_run_dir("pipeline-expert-checkpoint");
  run.seed = 7;
  auto attach = [&](TrainCheckpoints& checkpoints) { checkpoints.attach_pipeline(pipeline.get()); };
  // The file holds the whole model with the experts by id, as a single-rank run writes it; every
  // rank reads back exactly its part, in the starting placement.
  links.reset_counters();
  const std::string path = test::expect_checkpoint_holds(
      run, config, mine.training(), ep.get(), attach, whole.buffers(), whole.model.layout());
  // Each rank writes its own part into the file (parallel HDF5): no rank sends its layers or
  // experts to another, so none holds more than its part.
  const LinkCounters& sent = links.counters();
  EXPECT_EQ(sent.bytes[0] + sent.bytes[1], 0u) << "world rank " << test::world_rank();
  State restored(config, device, experts, layers);
  test::expect_checkpoint_loads(
      path, run, config, restored.training(), attach, restored.buffers(),
      {own_part[0].data(), own_part[1].data(), own_part[2].data(), own_part[3].data()}, layout);
  ep.reset();
  free_hierarchical(world_comm);
}

TEST(PipelineExpertCheckpoint, HoldsTheWholeModelByExpertIdAndLoadsEveryRanksPart) {
  for (const Case& c : cases_for(test::world_size())) check_checkpoint(c);
}

}  // namespace
}  // namespace rlf
