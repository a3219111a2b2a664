// Checkpoints of a model-parallel training state (train --pipeline-parallel P, --tensor-parallel T
// and both) at every world size the suite runs: the first model replica writes its stages' (each
// stage its own layers, parallel HDF5; with TP its ranks' slices of its stages gathered on TP rank
// 0 first) parameters, AdamW's moments and KL reference into the whole-model file, which holds
// exactly the single-rank state, and loading it gives every rank
// exactly its own part, so a checkpoint resumes at any PP, TP or DP degree.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
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
#include "src/model/tensor_parallel.h"
#include "src/runtime/pipeline_groups.h"
#include "src/runtime/pipeline_layout_switch.h"
#include "tests/micro_model_config.h"
#include "tests/mpi/checkpoint_state.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

struct Case {
  int tp, stages, virtual_stages;
};

std::string case_name(const Case& c) {
  return "TP " + std::to_string(c.tp) + " x PP " + std::to_string(c.stages) +
         " v=" + std::to_string(c.virtual_stages);
}

// Every PP degree dividing the world (v = 1 and 2), and TP and TP x PP layouts (DP = world /
// (TP x PP)).
std::vector<Case> cases_for(int world) {
  std::vector<Case> cases;
  for (int p = 1; p <= world; ++p) {
    if (world % p != 0) continue;
    cases.push_back({1, p, 1});
    if (p > 1) cases.push_back({1, p, 2});
  }
  switch (world) {
    case 2:
      cases.push_back({2, 1, 1});
      break;
    case 4:
      cases.insert(cases.end(), {{2, 1, 1}, {2, 2, 1}, {2, 2, 2}});
      break;
    case 6:
      cases.insert(cases.end(), {{2, 1, 1}, {3, 1, 1}, {2, 3, 1}, {3, 2, 1}});
      break;
    default:
      break;
  }
  return cases;
}

// A rank's training state (its part of the parameters, AdamW's moments and the reference), or
// the single-rank one.
struct State {
  Transformer<float> model, reference;
  AdamW<float> adamw;

  State(const ModelConfig& config, Arena& device, const LayerShard& layers,
        const TensorParallel* tp)
      : model(config, cpu_ops(), device, /*with_gradients=*/true, ExpertShard{}, layers, tp),
        reference(config, cpu_ops(), device, /*with_gradients=*/false, ExpertShard{}, layers, tp),
        adamw(model, AdamWHyper{}, 1.0f) {}

  TrainingState training() { return {&model, &adamw, &reference}; }
  // In checkpoint order: parameters, moments, reference.
  std::array<float*, 4> buffers() {
    return {model.parameters(), adamw.first_moment(), adamw.second_moment(),
            reference.parameters()};
  }
};

void check_checkpoint(const Case& c) {
  SCOPED_TRACE(case_name(c));
  const int world = test::world_size();
  const ModelConfig config = test::tensor_parallel_micro_config(2 * c.stages * c.virtual_stages);
  const uint64_t seed = test::seed_for("checkpoint " + case_name(c), world);
  Links links(test::virtual_node_list(world, 1), {});
  TensorParallel tp_groups(MPI_COMM_WORLD, c.tp, /*attention_only=*/false, config, links);
  // As train builds them: no TP groups at TP 1, no pipelines at PP 1.
  const TensorParallel* tp = c.tp > 1 ? &tp_groups : nullptr;
  std::unique_ptr<PipelineGroups> pipeline;
  if (c.stages > 1) {
    pipeline = std::make_unique<PipelineGroups>(
        MPI_COMM_WORLD, PipelineShape{c.stages, c.stages, c.virtual_stages}, config, links, tp);
  }
  const LayerShard layers =
      pipeline ? stage_layer_shard(pipeline->chunks(pipeline->stage()), config.n_layers)
               : LayerShard{};
  Arena device("part", 32 << 20), whole_device("whole", 32 << 20);
  // The single-rank state: parameters, AdamW's moments and the reference, all different.
  State whole(config, whole_device, LayerShard{}, nullptr);
  whole.model.initialize(seed);
  whole.reference.initialize(seed + 1);
  std::mt19937 gen(static_cast<uint32_t>(seed));
  test::fill_tensors(whole.adamw.first_moment(), whole.model.layout(), gen, false);
  test::fill_tensors(whole.adamw.second_moment(), whole.model.layout(), gen, true);
  // Each rank its part of it: its stage's tensors, with TP its slice of them.
  State mine(config, device, layers, tp);
  const ParameterLayout& layout = mine.model.layout();
  const ParameterLayout unsliced = with_tensor_slice(config, layout, TensorSlice{});
  std::vector<float> stage(size_t(unsliced.total()), 0.0f);
  for (size_t b = 0; b < 4; ++b) {
    copy_shared_tensors(whole.buffers()[b], whole.model.layout(), stage.data(), unsliced);
    slice_parameters(stage.data(), unsliced, mine.buffers()[b], layout);
  }

  RunOptions run;
  run.run_dir = test::shared_run_dir("model-parallel-checkpoint");
  run.seed = 7;
  auto attach = [&](TrainCheckpoints& checkpoints) {
    checkpoints.attach_pipeline(pipeline.get());
    checkpoints.attach_tensor_parallel(tp);
  };
  // The file holds the whole model, as a single-rank run writes it; every rank reads back
  // exactly its part.
  links.reset_counters();
  const std::string path = test::expect_checkpoint_holds(
      run, config, mine.training(), nullptr, attach, whole.buffers(), whole.model.layout());
  if ((pipeline || tp) && (!tp || tp->rank() == 0)) {
    // The stages write their own layers into the file (parallel HDF5): none sends its layers to
    // another; with TP only the slices move, to TP rank 0 (a gather, not an allgather), so no
    // rank but TP rank 0 holds more than its part, and that one only its stage's.
    const LinkCounters& sent = links.counters();
    EXPECT_EQ(sent.bytes[0] + sent.bytes[1], 0u) << "stage " << (pipeline ? pipeline->stage() : 0);
  }
  State restored(config, device, layers, tp);
  const std::array<float*, 4> own = mine.buffers();
  test::expect_checkpoint_loads(path, run, config, restored.training(), attach, restored.buffers(),
                                {own[0], own[1], own[2], own[3]}, layout);
}

TEST(ModelParallelCheckpoint, HoldsTheWholeModelAndLoadsEveryRanksPart) {
  for (const Case& c : cases_for(test::world_size())) check_checkpoint(c);
}

}  // namespace
}  // namespace rlf
