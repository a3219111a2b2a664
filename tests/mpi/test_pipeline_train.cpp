// Pipeline parallelism inside `train` at every world size the suite runs (every PP degree that
// divides it, 1 and 2 virtual stages): the layout switch that gives every stage the whole model
// for generation assembles exactly the single-rank model from the stages, moves exactly the
// layers a rank lacks (byte counters), and leaves the stage's own buffer bit for bit as it was;
// AdamW over the stages, its clipping norm summed over the pipeline, takes the single-rank
// model's clipped steps. Shapes that do not fit stop every rank with the same ConfigError. The
// training state beyond the weights: the KL reference's log-probs computed from its stages and
// shared over the pipeline are the single-rank reference's bit for bit, both gathered into a whole
// copy and through a forward-only pass over the reference's stages (with TP within rounding).
// (Checkpoints written from the stages: test_model_parallel_checkpoint.cpp.)
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "mpi_comm/links.h"
#include "src/app/pipeline_parallel_train.h"
#include "src/app/pipeline_reference.h"
#include "src/model/optimizer.h"
#include "src/model/tensor_parallel.h"
#include "src/rl/rl_step.h"
#include "src/runtime/pipeline_groups.h"
#include "src/runtime/pipeline_layout_switch.h"
#include "tests/micro_model_config.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

struct Shape {
  int stages, virtual_stages;
};

// Every PP degree dividing the world, with v = 1 and 2, on a model of 2 p v layers.
std::vector<Shape> shapes_for(int world) {
  std::vector<Shape> shapes;
  for (int p = 1; p <= world; ++p) {
    if (world % p != 0) continue;
    shapes.push_back({p, 1});
    shapes.push_back({p, 2});
  }
  return shapes;
}

ModelConfig model_for(const Shape& s) {
  ModelConfig config = test::micro_config();
  config.n_layers = 2 * s.stages * s.virtual_stages;
  return config;
}

std::string shape_name(const Shape& s) {
  return "PP " + std::to_string(s.stages) + " v=" + std::to_string(s.virtual_stages);
}

TEST(PipelineLayoutSwitch, GathersTheWholeModelAndLeavesTheStageBitIdentical) {
  const int world = test::world_size();
  for (const Shape& s : shapes_for(world)) {
    SCOPED_TRACE(shape_name(s));
    const ModelConfig config = model_for(s);
    const uint64_t seed = test::seed_for(shape_name(s), world);
    Links links(test::virtual_node_list(world, 1), {});
    PipelineGroups groups(MPI_COMM_WORLD, {s.stages, s.stages, s.virtual_stages}, config, links);
    Arena device("stage", 16 << 20);
    Transformer<float> stage(config, cpu_ops(), device, /*with_gradients=*/true, ExpertShard{},
                             stage_layer_shard(groups.chunks(groups.stage()), config.n_layers));
    stage.initialize(seed);
    ASSERT_EQ(stage.layout().total(), groups.stage_layout(groups.stage()).total());
    const std::vector<float> before(stage.parameters(),
                                    stage.parameters() + stage.parameter_count());
    Arena reference_device("reference", 16 << 20);
    Transformer<float> reference(config, cpu_ops(), reference_device, /*with_gradients=*/false);
    reference.initialize(seed);

    {
      // The generation phase: the whole model lives in the arena until the phase's scope ends.
      ArenaScope generation_memory(device);
      Transformer<float> whole(config, cpu_ops(), device, /*with_gradients=*/false);
      const LinkCounters before_switch = links.counters();
      const uint64_t received =
          gather_pipeline_model(stage.parameters(), groups, whole.parameters(), whole.layout());
      EXPECT_EQ(received,
                uint64_t(whole.parameter_count() - stage.parameter_count()) * sizeof(float));
      const LinkCounters& sent = links.counters();
      EXPECT_EQ(sent.bytes[0] + sent.bytes[1] - before_switch.bytes[0] - before_switch.bytes[1],
                uint64_t(stage.parameter_count()) * sizeof(float) * uint64_t(s.stages - 1));
      EXPECT_EQ(std::memcmp(whole.parameters(), reference.parameters(),
                            size_t(whole.parameter_count()) * sizeof(float)),
                0)
          << "the gathered model is not the single-rank initialization";
      // Generation would write activations and caches next to it; scribble over the copy.
      std::fill_n(whole.parameters(), whole.parameter_count(), 7.0f);
    }
    EXPECT_EQ(std::memcmp(stage.parameters(), before.data(), before.size() * sizeof(float)), 0)
        << "the round trip changed the stage's own layers";
    // The stage is exactly its part of the whole model.
    std::vector<float> part(before.size(), 0.0f);
    copy_shared_tensors(reference.parameters(), reference.layout(), part.data(), stage.layout());
    EXPECT_EQ(std::memcmp(part.data(), before.data(), before.size() * sizeof(float)), 0);
  }
}

TEST(PipelineLayoutSwitch, StageAdamWTakesTheSingleRankClippedSteps) {
  const int world = test::world_size();
  for (const Shape& s : shapes_for(world)) {
    SCOPED_TRACE(shape_name(s));
    const ModelConfig config = model_for(s);
    const uint64_t seed = test::seed_for("adamw " + shape_name(s), world);
    Links links(test::virtual_node_list(world, 1), {});
    PipelineGroups groups(MPI_COMM_WORLD, {s.stages, s.stages, s.virtual_stages}, config, links);
    Arena device("stage", 16 << 20), reference_device("reference", 16 << 20);
    Transformer<float> stage(config, cpu_ops(), device, true, ExpertShard{},
                             stage_layer_shard(groups.chunks(groups.stage()), config.n_layers));
    Transformer<float> reference(config, cpu_ops(), reference_device, true);
    stage.initialize(seed);
    reference.initialize(seed);
    AdamWHyper hyper;
    hyper.learning_rate = 0.01f;
    const float max_norm = 0.5f;  // far below the gradients' norm: every step clips
    AdamW<float> stage_adamw(stage, hyper, max_norm), reference_adamw(reference, hyper, max_norm);
    stage_adamw.set_shard(groups.optimizer_shard(stage.layout()));
    std::mt19937 gen(static_cast<uint32_t>(seed));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int step = 0; step < 3; ++step) {
      // The same whole-model gradient on every rank; each stage takes its part
      // (tensor by tensor: the buffer's alignment gaps between tensors stay zero)
      for (const ParameterTensor& t : reference.layout().tensors())
        for (int64_t i = 0; i < t.numel; ++i) reference.gradients()[t.offset + i] = normal(gen);
      copy_shared_tensors(reference.gradients(), reference.layout(), stage.gradients(),
                          stage.layout());
      const double norm = stage_adamw.step(), want = reference_adamw.step();
      EXPECT_NEAR(norm, want, 1e-6 * want) << "step " << step;
    }
    std::vector<float> want(size_t(stage.parameter_count()), 0.0f);
    copy_shared_tensors(reference.parameters(), reference.layout(), want.data(), stage.layout());
    EXPECT_LT(test::nmse(stage.parameters(), want.data(), want.size()), 1e-10);
  }
}

TEST(PipelineLayoutSwitch, ShapesThatDoNotFitStopEveryRank) {
  const int world = test::world_size();
  Links links(test::virtual_node_list(world, 1), {});
  ModelConfig config = test::micro_config();
  config.n_layers = 3;
  test::expect_config_error_everywhere(
      [&] {
        PipelineGroups(MPI_COMM_WORLD, {world + 1, 1, 1}, config, links);
      },
      "--pipeline-parallel " + std::to_string(world + 1) + " must divide the world size");
  test::expect_config_error_everywhere(
      [&] {
        PipelineGroups(MPI_COMM_WORLD, {1, 1, 2}, config, links);
      },
      "--pipeline-parallel 1 x --virtual-stages 2 = 2 model chunks must divide the model's 3");
  // Chunk boundaries (stage balancing) need not cut equal chunks, but must cut the layers.
  EXPECT_NO_THROW(PipelineGroups(MPI_COMM_WORLD, {1, 1, 2}, config, links, nullptr, 1, {0, 2, 3}));
  test::expect_config_error_everywhere(
      [&] {
        PipelineGroups(MPI_COMM_WORLD, {1, 1, 2}, config, links, nullptr, 1, {0, 1, 2, 3});
      },
      "--pipeline-balance 1,1,1: needs one layer count per model chunk, --pipeline-parallel 1 x "
      "--virtual-stages 2 = 2, got 3");
  test::expect_config_error_everywhere(
      [&] {
        PipelineGroups(MPI_COMM_WORLD, {1, 1, 2}, config, links, nullptr, 1, {0, 3, 3});
      },
      "--pipeline-balance 3,0: every chunk needs at least one layer");
  test::expect_config_error_everywhere(
      [&] {
        PipelineGroups(MPI_COMM_WORLD, {1, 1, 2}, config, links, nullptr, 1, {0, 1, 2});
      },
      "--pipeline-balance 1,1: the chunks hold 2 layers, the model has 3");
}

// Block `block` of a pipeline's samples: `count` short rollouts over the micro model's vocabulary,
// the same on every rank that makes it.
std::vector<Rollout> sample_block(uint64_t seed, int block, int count) {
  std::mt19937 gen(static_cast<uint32_t>(test::hash(seed, uint64_t(block), 0)));
  std::uniform_int_distribution<int> token(1, 10), length(1, 6);
  std::vector<Rollout> rollouts(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    Rollout& r = rollouts[size_t(i)];
    r.sample_id = int64_t(block) * count + i;
    r.prompt.push_back(0);
    for (int k = length(gen); k > 0; --k) r.prompt.push_back(token(gen));
    for (int k = length(gen); k > 0; --k) r.response.push_back(token(gen));
  }
  return rollouts;
}

TEST(PipelineTrainState, ReferenceLogprobsFromTheStagesAreTheSingleRankOnes) {
  const int world = test::world_size();
  for (const Shape& s : shapes_for(world)) {
    SCOPED_TRACE(shape_name(s));
    const ModelConfig config = model_for(s);
    const uint64_t seed = test::seed_for("reference " + shape_name(s), world);
    Links links(test::virtual_node_list(world, 1), {});
    PipelineGroups groups(MPI_COMM_WORLD, {s.stages, s.stages, s.virtual_stages}, config, links);
    Arena device("stage", 16 << 20), whole_device("whole", 16 << 20);
    Transformer<float> stage(config, cpu_ops(), device, /*with_gradients=*/false, ExpertShard{},
                             stage_layer_shard(groups.chunks(groups.stage()), config.n_layers));
    Transformer<float> whole(config, cpu_ops(), whole_device, /*with_gradients=*/false);
    stage.initialize(seed);
    whole.initialize(seed);
    const int count = 5, micro_batch = 2;
    const float temperature = 0.8f;
    // Single rank: every block's log-probs from the whole reference, in the same micro-batches.
    std::vector<Rollout> want;
    for (int b = 0; b < s.stages; ++b) {
      std::vector<Rollout> block = sample_block(seed, b, count);
      attach_reference_logprobs(whole, block, micro_batch, temperature);
      want.insert(want.end(), block.begin(), block.end());
    }
    std::vector<Rollout> own = sample_block(seed, groups.stage(), count);
    const size_t used_before = device.used();
    const uint64_t received =
        attach_pipeline_reference_logprobs(stage, groups, device, own, micro_batch, temperature);
    EXPECT_EQ(device.used(), used_before) << "the gathered reference outlived the call";
    EXPECT_EQ(received,
              uint64_t(whole.parameter_count() - stage.parameter_count()) * sizeof(float));
    for (int i = 0; i < count; ++i) {
      EXPECT_EQ(own[size_t(i)].reference_logp,
                want[size_t(groups.stage() * count + i)].reference_logp)
          << "own sample " << i;
    }
    // Every stage receives the whole pipeline's log-probs, in the stages' order.
    std::vector<Rollout> pipeline_samples;
    for (int b = 0; b < s.stages; ++b) {
      const std::vector<Rollout> block = sample_block(seed, b, count);
      pipeline_samples.insert(pipeline_samples.end(), block.begin(), block.end());
    }
    gather_reference_logprobs(own, groups, pipeline_samples);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(pipeline_samples[i].reference_logp, want[i].reference_logp) << "sample " << i;
    }
  }
}

struct ReferenceCase {
  int tp, stages, virtual_stages;
};

// Every PP degree dividing the world (v = 1 and 2), and TP x PP layouts (DP = world / (TP x PP)).
std::vector<ReferenceCase> reference_cases_for(int world) {
  std::vector<ReferenceCase> cases;
  for (const Shape& s : shapes_for(world)) cases.push_back({1, s.stages, s.virtual_stages});
  if (world == 4) cases.insert(cases.end(), {{2, 2, 1}, {2, 2, 2}});
  if (world == 6) cases.insert(cases.end(), {{2, 3, 1}, {3, 2, 1}});
  return cases;
}

TEST(PipelineTrainState, ReferenceLogprobsThroughThePipelineAreTheSingleRankOnes) {
  const int world = test::world_size();
  for (const ReferenceCase& c : reference_cases_for(world)) {
    const std::string name = "TP " + std::to_string(c.tp) + " x PP " + std::to_string(c.stages) +
                             " v=" + std::to_string(c.virtual_stages);
    SCOPED_TRACE(name);
    const ModelConfig config = test::tensor_parallel_micro_config(2 * c.stages * c.virtual_stages);
    const uint64_t seed = test::seed_for("reference pipeline " + name, world);
    Links links(test::virtual_node_list(world, 1), {});
    TensorParallel tp_groups(MPI_COMM_WORLD, c.tp, /*attention_only=*/false, config, links);
    const TensorParallel* tp = c.tp > 1 ? &tp_groups : nullptr;
    const int count = 5, micro_batch = 2;
    // m: every block of the replica in pieces of micro_batch.
    const int blocks = c.tp * c.stages, pieces = (count + micro_batch - 1) / micro_batch;
    PipelineGroups groups(MPI_COMM_WORLD, {c.stages, blocks * pieces, c.virtual_stages}, config,
                          links, tp);
    Arena device("stage", 16 << 20), whole_device("whole", 16 << 20);
    Transformer<float> stage(config, cpu_ops(), device, /*with_gradients=*/false, ExpertShard{},
                             stage_layer_shard(groups.chunks(groups.stage()), config.n_layers), tp);
    Transformer<float> whole(config, cpu_ops(), whole_device, /*with_gradients=*/false);
    stage.initialize(seed);
    whole.initialize(seed);
    const float temperature = 0.8f;
    // The replica's samples (replicas differ), and the single rank's log-probs of them: every
    // block from the whole reference in pieces of micro_batch, as the data-parallel run does.
    const int replica = groups.model_parallel().world_ranks[0] / blocks;
    std::vector<Rollout> samples, want;
    for (int b = 0; b < blocks; ++b) {
      std::vector<Rollout> block = sample_block(seed, replica * blocks + b, count);
      samples.insert(samples.end(), block.begin(), block.end());
      attach_reference_logprobs(whole, block, micro_batch, temperature);
      want.insert(want.end(), block.begin(), block.end());
    }
    const size_t used_before = device.used();
    const uint64_t sent =
        pipeline_reference_logprobs(stage, groups, samples, micro_batch, temperature, 13);
    EXPECT_EQ(device.used(), used_before) << "the pass left memory in the device arena";
    // The activations sent: every micro-batch's rows out of every chunk but the model's last.
    uint64_t tokens = 0;
    for (const Rollout& r : samples) tokens += r.prompt.size() + r.response.size() - 1;
    int sending_chunks = 0;
    for (int k = 0; k < c.virtual_stages; ++k) {
      sending_chunks +=
          virtual_stage(groups.shape(), groups.stage(), k) + 1 < groups.shape().chunks();
    }
    EXPECT_EQ(sent, tokens * uint64_t(sending_chunks) * uint64_t(config.d_model) * sizeof(float));
    for (size_t i = 0; i < want.size(); ++i) {
      if (c.tp == 1) {
        // The same arithmetic in the same micro-batches, layer by layer: bit for bit.
        EXPECT_EQ(samples[i].reference_logp, want[i].reference_logp) << "sample " << i;
        continue;
      }
      // TP sums the slices' partial products in another order: float rounding.
      ASSERT_EQ(samples[i].reference_logp.size(), want[i].reference_logp.size());
      for (size_t t = 0; t < want[i].reference_logp.size(); ++t) {
        EXPECT_NEAR(samples[i].reference_logp[t], want[i].reference_logp[t],
                    1e-5f * (1.0f + std::abs(want[i].reference_logp[t])))
            << "sample " << i << " token " << t;
      }
    }
  }
}

}  // namespace
}  // namespace rlf
