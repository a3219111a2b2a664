// Pipeline parallelism inside `train` at every world size the suite runs (every PP degree that
// divides it, 1 and 2 virtual stages): the layout switch that gives every stage the whole model
// for generation assembles exactly the single-rank model from the stages, moves exactly the
// layers a rank lacks (byte counters), and leaves the stage's own buffer bit for bit as it was;
// gathered onto the first stage alone (checkpoints, the saved model), only the others send;
// without training TP each rank of a pipeline gets its generation TP slice of the single-rank
// model, receiving and sending only slices;
// AdamW over the stages, its clipping norm summed over the pipeline, takes the single-rank
// model's clipped steps. Shapes that do not fit stop every rank with the same ConfigError. The
// training state beyond the weights: the KL reference's log-probs computed by a forward-only pass
// over the reference's stages and shared over the pipeline are the single-rank reference's bit for
// bit (with TP within rounding); so are, with StaleSync's unequal blocks, the reference's and the
// proximal ones (with EP inside the stages within rounding).
// (Checkpoints written from the stages: test_model_parallel_checkpoint.cpp.)
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
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
#include "src/runtime/role_expert_parallel.h"
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
    {
      // Onto the first stage only (a checkpoint's or the saved model's writer): the other stages
      // send it their layers and receive nothing, so none holds more than its stage.
      const bool root = groups.stage() == 0;
      const size_t total = size_t(reference.layout().total());
      std::vector<float> whole(root ? total : 0, 3.0f);
      const LinkCounters before_gather = links.counters();
      const uint64_t received = gather_pipeline_model(
          stage.parameters(), groups, root ? whole.data() : nullptr, reference.layout(), 0);
      const LinkCounters& after = links.counters();
      const uint64_t sent =
          after.bytes[0] + after.bytes[1] - before_gather.bytes[0] - before_gather.bytes[1];
      if (root) {
        EXPECT_EQ(received,
                  uint64_t(reference.parameter_count() - stage.parameter_count()) * sizeof(float));
        EXPECT_EQ(sent, 0u);
        EXPECT_EQ(std::memcmp(whole.data(), reference.parameters(), total * sizeof(float)), 0)
            << "the model gathered onto the first stage is not the single-rank initialization";
      } else {
        EXPECT_EQ(received, 0u);
        EXPECT_EQ(sent, uint64_t(stage.parameter_count()) * sizeof(float));
      }
    }
    EXPECT_EQ(std::memcmp(stage.parameters(), before.data(), before.size() * sizeof(float)), 0)
        << "the round trip changed the stage's own layers";
    // The stage is exactly its part of the whole model.
    std::vector<float> part(before.size(), 0.0f);
    copy_shared_tensors(reference.parameters(), reference.layout(), part.data(), stage.layout());
    EXPECT_EQ(std::memcmp(part.data(), before.data(), before.size() * sizeof(float)), 0);
  }
}

// Training at TP 1 generating at TP G (fused --pipeline-parallel P --actor-tensor-parallel G):
// generation TP groups are G consecutive ranks, pipelines P consecutive ranks, so the ranks of a
// pipeline may assemble different slices. Every rank gets exactly its slice of the single-rank
// model, receives only the other stages' layers at its slice, and sends each pipeline mate that
// mate's slice of its stage (counted); the stage is left as it was.
TEST(PipelineLayoutSwitch, GivesEachRankItsGenerationSliceWithoutTrainingTensorParallelism) {
  const int world = test::world_size();
  const int rank = test::world_rank();
  int cases = 0;
  for (const Shape& s : shapes_for(world)) {
    for (int g = 2; g <= world; ++g) {
      const ModelConfig config =
          test::tensor_parallel_micro_config(2 * s.stages * s.virtual_stages);
      if (!tensor_parallel_problem(config, g, /*attention_only=*/false, world).empty()) continue;
      SCOPED_TRACE(shape_name(s) + ", generation TP " + std::to_string(g));
      ++cases;
      const uint64_t seed = test::seed_for(shape_name(s) + " slices", world * 10 + g);
      Links links(test::virtual_node_list(world, 1), {});
      PipelineGroups groups(MPI_COMM_WORLD, {s.stages, s.stages, s.virtual_stages}, config, links);
      Arena device("stage", 16 << 20);
      Transformer<float> stage(config, cpu_ops(), device, /*with_gradients=*/true, ExpertShard{},
                               stage_layer_shard(groups.chunks(groups.stage()), config.n_layers));
      stage.initialize(seed);
      const std::vector<float> before(stage.parameters(),
                                      stage.parameters() + stage.parameter_count());
      Arena reference_device("reference", 16 << 20);
      Transformer<float> reference(config, cpu_ops(), reference_device, /*with_gradients=*/false);
      reference.initialize(seed);
      const TensorSlice slice{rank % g, g, false};
      const ParameterLayout sliced = with_tensor_slice(config, reference.layout(), slice);
      std::vector<float> expected(size_t(sliced.total()), 0.0f);
      slice_parameters(reference.parameters(), reference.layout(), expected.data(), sliced);
      // What this rank should receive and send: the other stages at its slice, its stage at each
      // mate's slice (a mate is a pipeline rank: stage = rank % P, consecutive ranks).
      uint64_t expected_received = 0, expected_sent = 0;
      const int first = rank - groups.stage();
      for (int other = 0; other < s.stages; ++other) {
        if (other == groups.stage()) continue;
        expected_received +=
            uint64_t(with_tensor_slice(config, groups.stage_layout(other), slice).total()) *
            sizeof(float);
        const TensorSlice mate{(first + other) % g, g, false};
        expected_sent +=
            uint64_t(with_tensor_slice(config, stage.layout(), mate).total()) * sizeof(float);
      }
      std::vector<float> whole(size_t(sliced.total()), 5.0f);
      const LinkCounters before_switch = links.counters();
      const uint64_t received =
          gather_pipeline_model(stage.parameters(), groups, whole.data(), sliced);
      const LinkCounters& after = links.counters();
      EXPECT_EQ(received, expected_received);
      EXPECT_EQ(after.bytes[0] + after.bytes[1] - before_switch.bytes[0] - before_switch.bytes[1],
                expected_sent);
      EXPECT_EQ(std::memcmp(whole.data(), expected.data(), expected.size() * sizeof(float)), 0)
          << "the generation slice is not the single-rank model's";
      EXPECT_EQ(std::memcmp(stage.parameters(), before.data(), before.size() * sizeof(float)), 0)
          << "the switch changed the stage's own layers";
    }
  }
  // 1 rank: no generation TP degree; 2 ranks and more: at least TP 2.
  if (world > 1) {
    EXPECT_GT(cases, 0);
  }
}

// With link emulation every stage received over an inter-node link delays the receiver by its
// emulated time (a lower bound: emulation sleeps): on nodes of one rank each, the switch takes at
// least P - 1 message latencies on every rank.
TEST(PipelineLayoutSwitch, EmulatedInterNodeLinksDelayTheSwitch) {
  const int world = test::world_size();
  constexpr double kLatency = 0.02;
  for (const Shape& s : shapes_for(world)) {
    if (s.stages < 2 || s.virtual_stages != 1) continue;
    SCOPED_TRACE(shape_name(s));
    const ModelConfig config = model_for(s);
    Links links(test::virtual_node_list(world, 1), LinkEmulation{0, kLatency});
    PipelineGroups groups(MPI_COMM_WORLD, {s.stages, s.stages, 1}, config, links);
    Arena device("stage", 16 << 20);
    Transformer<float> stage(config, cpu_ops(), device, /*with_gradients=*/false, ExpertShard{},
                             stage_layer_shard(groups.chunks(groups.stage()), config.n_layers));
    stage.initialize(test::seed_for("emulated " + shape_name(s), world));
    const ParameterLayout whole_layout(config);
    std::vector<float> whole(size_t(whole_layout.total()));
    const double start = steady_seconds();
    gather_pipeline_model(stage.parameters(), groups, whole.data(), whole_layout);
    EXPECT_GE(steady_seconds() - start, (s.stages - 1) * kLatency - 1e-6);
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
        pipeline_reference_logprobs(stage, groups, samples, {}, micro_batch, temperature, 13);
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

struct UnequalCase {
  int stages, virtual_stages, ep;
};

// PP x DP and PP x EP layouts dividing the world (DP = world / PP, a multiple of EP).
std::vector<UnequalCase> unequal_cases_for(int world) {
  std::vector<UnequalCase> cases;
  for (const Shape& s : shapes_for(world)) {
    cases.push_back({s.stages, s.virtual_stages, 1});
    const int pipelines = world / s.stages;
    if (pipelines % 2 == 0) cases.push_back({s.stages, s.virtual_stages, 2});
  }
  return cases;
}

// StaleSync under PP: every rank of a model replica finished its own count of samples, and the
// log-probs that anchor the loss come from forward-only passes over the stages: the reference's
// for every sample, the policy's proximal ones for the samples after each block's first
// minibatch. Each is the single rank's, computed block by block as the data-parallel rank would,
// bit for bit without EP; with EP (the experts of each stage spread over its pipelines, which
// pad to the largest micro-batch count of the stage's group) within float rounding. Blocks are
// empty on some ranks, and with EP one pipeline holds no sample at all.
TEST(PipelineTrainState, UnequalBlocksReferenceAndProximalThroughThePipelineAreTheSingleRankOnes) {
  const int world = test::world_size();
  for (const UnequalCase& c : unequal_cases_for(world)) {
    const std::string name = "PP " + std::to_string(c.stages) +
                             " v=" + std::to_string(c.virtual_stages) + " EP " +
                             std::to_string(c.ep);
    SCOPED_TRACE(name);
    ModelConfig config = model_for({c.stages, c.virtual_stages});
    config.n_experts = 4;
    config.validate("test");
    const uint64_t seed = test::seed_for("unequal blocks " + name, world);
    Links links(test::virtual_node_list(world, 1), {});
    PipelineGroups groups(MPI_COMM_WORLD, {c.stages, c.stages, c.virtual_stages}, config, links,
                          nullptr, c.ep);
    std::unique_ptr<RoleExpertParallel> ep;
    if (c.ep > 1) {
      ep = std::make_unique<RoleExpertParallel>(groups.data_parallel(), links, config.n_experts,
                                                c.ep, DispatchMode::Flat);
    }
    Arena device("stage", 16 << 20), whole_device("whole", 16 << 20);
    Transformer<float> stage(config, cpu_ops(), device, /*with_gradients=*/true,
                             groups.expert_shard(),
                             stage_layer_shard(groups.chunks(groups.stage()), config.n_layers));
    Transformer<float> whole(config, cpu_ops(), whole_device, /*with_gradients=*/false);
    stage.initialize(seed);
    whole.initialize(seed);
    RlStepSettings settings;
    settings.group_size = 2;
    settings.minibatches = 2;
    settings.micro_batch = 2;
    settings.temperature = 0.8f;
    // Rank r of pipeline q finished 2 + (q + r) % 2 groups of 2, but rank 1 none; with EP, the
    // second pipeline of every EP pair finished none at all.
    const int replica = groups.replica();
    std::vector<Rollout> samples, want;
    for (int b = 0; b < c.stages; ++b) {
      const bool idle = b == 1 || (c.ep > 1 && replica % 2 == 1);
      const int count = idle ? 0 : settings.group_size * (2 + (replica + b) % 2);
      settings.block_sizes.push_back(size_t(count));
      std::vector<Rollout> block = sample_block(seed, replica * c.stages + b, count);
      samples.insert(samples.end(), block.begin(), block.end());
      // The single rank: the data-parallel rank's own micro-batches.
      attach_reference_logprobs(whole, block, settings.micro_batch, settings.temperature);
      attach_proximal_logprobs(whole, block, settings);
      want.insert(want.end(), block.begin(), block.end());
    }
    const size_t used_before = device.used();
    device.start_phase_peak();
    pipeline_reference_logprobs(stage, groups, samples, settings.block_sizes, settings.micro_batch,
                                settings.temperature, 13, ep.get());
    pipeline_proximal_logprobs(stage, groups, samples, settings, 13, ep.get());
    // No rank holds more of the model than its stage: nothing (no gathered copy) was allocated in
    // the device arena, even for a while.
    EXPECT_EQ(device.phase_peak(), used_before) << "the passes allocated in the device arena";
    EXPECT_EQ(device.used(), used_before) << "the passes left memory in the device arena";
    size_t with_proximal = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      with_proximal += !want[i].proximal_logp.empty();
      for (const auto member : {&Rollout::reference_logp, &Rollout::proximal_logp}) {
        const std::vector<float>& got = samples[i].*member;
        const std::vector<float>& expected = want[i].*member;
        if (c.ep == 1) {
          EXPECT_EQ(got, expected) << "sample " << i;
          continue;
        }
        // The experts' rows come from every pipeline of the EP group: float rounding.
        ASSERT_EQ(got.size(), expected.size()) << "sample " << i;
        for (size_t t = 0; t < expected.size(); ++t) {
          EXPECT_NEAR(got[t], expected[t], 1e-5f * (1.0f + std::abs(expected[t])))
              << "sample " << i << " token " << t;
        }
      }
    }
    // Every non-empty block has first-minibatch samples (no proximal log-probs) and later ones.
    if (!want.empty()) {
      EXPECT_GT(with_proximal, 0u);
      EXPECT_LT(with_proximal, want.size());
    }
  }
}

}  // namespace
}  // namespace rlf
