// Generation at a TP degree G dividing the training one after a TP (x PP) layout switch (train
// --tensor-parallel T [--pipeline-parallel P] --actor-tensor-parallel G) at every world size the
// suite runs: the switch gives each rank exactly its generation TP slice of the single-rank model,
// bit for bit, receiving only the training slices it lacks from its TP mates and its generation
// slice of the other stages (counted; at G = T nothing inside the TP group, and fewer bytes than
// the switch to data-parallel generation), and leaves the stage bit for bit as it was; generation
// collective over the G-rank groups gives the single-rank model's tokens and log-probs; a slice
// other than the rank's is refused. Without a pipeline, every G dividing T (G = 1: the whole
// model), and a TP group gathers its ranks' samples in canonical order.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "mpi_comm/links.h"
#include "src/app/tensor_parallel_train.h"
#include "src/model/tensor_parallel.h"
#include "src/roles/rollout_samples.h"
#include "src/roles/sample_packing.h"
#include "src/runtime/pipeline_groups.h"
#include "src/runtime/pipeline_layout_switch.h"
#include "tests/micro_model_config.h"
#include "tests/mpi/generation_match.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

// A model of `layers` layers whose heads (12) and shared expert width (12) TP 2, 3, 4 and 6
// divide.
ModelConfig regroup_config(int layers = 2) {
  ModelConfig config = test::tensor_parallel_micro_config(layers);
  config.d_model = 24;
  config.n_heads = 12;
  config.validate("test");
  return config;
}

// Rank t of a training TP group of `degree` needs training slices [(t % G) T / G, (t % G + 1) T /
// G) for generation slice t % G: how many of its TP mates it receives from, and sends to.
struct RegroupPeers {
  uint64_t givers = 0, takers = 0;
};

RegroupPeers regroup_peers(int degree, int generation_degree, int t) {
  const int per_target = degree / generation_degree;
  RegroupPeers peers;
  for (int r = 0; r < degree; ++r) {
    if (r == t) continue;
    peers.givers += r / per_target == t % generation_degree ? 1 : 0;
    peers.takers += t / per_target == r % generation_degree ? 1 : 0;
  }
  return peers;
}

struct Case {
  int tp, stages, generation;
};

std::string case_name(const Case& c) {
  return "TP " + std::to_string(c.tp) + " x PP " + std::to_string(c.stages) + " -> TP " +
         std::to_string(c.generation);
}

// TP x PP x DP layouts of every world size the suite runs (DP = world / (TP x PP)), TP 2 or more,
// and generation TP degrees G > 1 dividing T (G = 1: the TensorPipeline tests).
std::vector<Case> cases_for(int world) {
  switch (world) {
    case 2:
      return {{2, 1, 2}};
    case 4:
      return {{2, 2, 2}, {2, 1, 2}, {4, 1, 2}, {4, 1, 4}};
    case 6:
      return {{2, 3, 2}, {3, 2, 3}, {2, 1, 2}, {6, 1, 2}, {6, 1, 3}};
    default:
      return {};
  }
}

struct Ranks {
  Links links;
  TensorParallel tp;
  PipelineGroups groups;

  Ranks(const Case& c, const ModelConfig& config)
      : links(test::virtual_node_list(test::world_size(), 1), {}),
        tp(MPI_COMM_WORLD, c.tp, /*attention_only=*/false, config, links),
        groups(MPI_COMM_WORLD, {c.stages, c.stages, 1}, config, links, &tp) {}
};

// Bytes of this rank's generation TP slice of stage `stage`.
uint64_t slice_bytes(const PipelineGroups& groups, const TensorParallel& generation, int stage) {
  return uint64_t(with_tensor_slice(groups.config(), groups.stage_layout(stage), generation.slice())
                      .total()) *
         sizeof(float);
}

void check_switch_and_generation(const Case& c) {
  SCOPED_TRACE(case_name(c));
  const ModelConfig config = regroup_config(2 * c.stages);
  const uint64_t seed =
      test::seed_for("TensorPipelineGeneration " + case_name(c), test::world_size());
  Ranks ranks(c, config);
  const PipelineGroups& groups = ranks.groups;
  Arena stage_device("stage", 16 << 20), device("generation", 64 << 20),
      reference_device("reference", 64 << 20);
  Transformer<float> stage(config, cpu_ops(), stage_device, /*with_gradients=*/false, ExpertShard{},
                           stage_layer_shard(groups.chunks(groups.stage()), config.n_layers),
                           &ranks.tp);
  stage.initialize(seed);
  Transformer<float> reference(config, cpu_ops(), reference_device, /*with_gradients=*/false);
  reference.initialize(seed);

  // The switch: this rank's generation TP slice of every layer.
  TensorParallel generation(MPI_COMM_WORLD, c.generation, /*attention_only=*/false, config,
                            ranks.links);
  Transformer<float> whole(config, cpu_ops(), device, /*with_gradients=*/false, ExpertShard{},
                           LayerShard{}, &generation);
  std::fill_n(whole.parameters(), whole.parameter_count(), 7.0f);
  const std::vector<float> before(stage.parameters(), stage.parameters() + stage.parameter_count());
  const uint64_t sent_before = test::link_bytes(ranks.links);
  const uint64_t received =
      gather_pipeline_model(stage.parameters(), groups, whole.parameters(), whole.layout());
  const uint64_t sent = test::link_bytes(ranks.links) - sent_before;
  std::vector<float> want(size_t(whole.parameter_count()), 0.0f);
  slice_parameters(reference.parameters(), reference.layout(), want.data(), whole.layout());
  EXPECT_EQ(std::memcmp(whole.parameters(), want.data(), want.size() * sizeof(float)), 0)
      << "the switch did not give this rank its generation slice of the single-rank model";
  EXPECT_EQ(std::memcmp(stage.parameters(), before.data(), before.size() * sizeof(float)), 0)
      << "the layout switch changed the stage";
  // Inside the TP group only the training slices a rank lacks (none at G = T), then each stage's
  // generation slice to the P - 1 other stages of its pipeline.
  uint64_t cut_bytes = 0;
  for (const ParameterRange& r : tensor_parallel_ranges(stage.layout()))
    cut_bytes += uint64_t(r.count) * sizeof(float);
  const RegroupPeers peers = regroup_peers(c.tp, c.generation, ranks.tp.rank());
  uint64_t other_slices = 0;
  for (int s = 0; s < c.stages; ++s) {
    if (s != groups.stage()) other_slices += slice_bytes(groups, generation, s);
  }
  EXPECT_EQ(received, peers.givers * cut_bytes + other_slices);
  EXPECT_EQ(sent, peers.takers * cut_bytes +
                      slice_bytes(groups, generation, groups.stage()) * uint64_t(c.stages - 1));
  // The switch to data-parallel generation (the whole model on every rank) moves more.
  {
    ArenaScope scope(device);
    Transformer<float> replica(config, cpu_ops(), device, /*with_gradients=*/false);
    const uint64_t data_parallel_received =
        gather_pipeline_model(stage.parameters(), groups, replica.parameters(), replica.layout());
    EXPECT_LT(received, data_parallel_received);
    EXPECT_EQ(std::memcmp(replica.parameters(), reference.parameters(),
                          size_t(reference.parameter_count()) * sizeof(float)),
              0);
  }

  // Generation collective over the TP group (each group its own prompts) against the single-rank
  // model: sampled and greedy.
  std::vector<std::vector<int>> prompts;
  std::vector<int64_t> ids;
  const uint64_t prompt_seed = seed + uint64_t(generation.replica()) * 7;
  const std::vector<int> lengths = test::random_ints(5, prompt_seed, 1, 6);
  for (size_t s = 0; s < lengths.size(); ++s) {
    prompts.push_back(
        test::random_ints(size_t(lengths[s]), prompt_seed + 31 * s + 1, 0, config.vocab_size - 1));
    ids.push_back(int64_t(generation.replica()) * 100 + int64_t(s));
  }
  test::expect_generation_like(whole, reference, prompts, ids, seed, 12);
}

TEST(TensorPipelineGeneration, SwitchToAGenerationTpDegreeGeneratesLikeTheSingleRankModel) {
  const std::vector<Case> cases = cases_for(test::world_size());
  if (cases.empty()) GTEST_SKIP() << "TP generation on 2, 4 and 6 ranks";
  for (const Case& c : cases) {
    check_switch_and_generation(c);
    ASSERT_TRUE(test::on_every_rank(!::testing::Test::HasFailure())) << case_name(c);
  }
}

// A whole model sliced otherwise than the rank's training slice would mix heads: refused before
// any message.
TEST(TensorPipelineGeneration, AnotherSliceIsRefused) {
  if (test::world_size() % 2 != 0) GTEST_SKIP() << "needs TP 2";
  const Case c{2, 1, 2};
  const ModelConfig config = test::tensor_parallel_micro_config(2);
  Ranks ranks(c, config);
  Arena device("stage", 16 << 20);
  Transformer<float> stage(config, cpu_ops(), device, /*with_gradients=*/false, ExpertShard{},
                           LayerShard{}, &ranks.tp);
  const TensorSlice other{1 - ranks.tp.rank(), 2, false};
  const ParameterLayout wrong(config, ExpertShard{}, LayerShard{}, other);
  std::vector<float> whole(size_t(wrong.total()));
  EXPECT_THROW(gather_pipeline_model(stage.parameters(), ranks.groups, whole.data(), wrong),
               std::invalid_argument);
}

// TP degrees without a pipeline (TP x DP) of every world size the suite runs (TP 1: the trivial
// switch).
std::vector<int> tensor_degrees_for(int world) {
  switch (world) {
    case 1:
      return {1};
    case 2:
      return {2};
    case 4:
      return {2, 4};
    case 6:
      return {2, 3, 6};
    default:
      return {};
  }
}

// TP T -> TP G for every G dividing T (G = 1: data-parallel, the whole model on every rank).
void check_regroup(int degree, int generation_degree) {
  SCOPED_TRACE("TP " + std::to_string(degree) + " -> TP " + std::to_string(generation_degree));
  const ModelConfig config = regroup_config();
  const uint64_t seed = test::seed_for("Regroup", degree * 10 + generation_degree);
  Links links(test::virtual_node_list(test::world_size(), 1), {});
  TensorParallel tp(MPI_COMM_WORLD, degree, /*attention_only=*/false, config, links);
  TensorParallel generation(MPI_COMM_WORLD, generation_degree, /*attention_only=*/false, config,
                            links);
  Arena slice_device("slice", 16 << 20), device("generation", 64 << 20),
      reference_device("reference", 64 << 20);
  Transformer<float> slice(config, cpu_ops(), slice_device, /*with_gradients=*/false, {}, {}, &tp);
  Transformer<float> generator(config, cpu_ops(), device, /*with_gradients=*/false, {}, {},
                               generation_degree > 1 ? &generation : nullptr);
  Transformer<float> reference(config, cpu_ops(), reference_device, /*with_gradients=*/false);
  slice.initialize(seed);
  reference.initialize(seed);
  std::fill_n(generator.parameters(), generator.parameter_count(), 7.0f);
  const std::vector<float> before(slice.parameters(), slice.parameters() + slice.parameter_count());
  const uint64_t sent_before = test::link_bytes(links);
  const uint64_t received = regroup_tensor_slices(
      slice.parameters(), slice.layout(), generator.parameters(), generator.layout(), config, tp);
  const uint64_t sent = test::link_bytes(links) - sent_before;
  // Every tensor of the generation slice (the alignment gaps, 7 here, are not written).
  std::vector<float> want(size_t(generator.parameter_count()), 0.0f);
  slice_parameters(reference.parameters(), reference.layout(), want.data(), generator.layout());
  for (const ParameterTensor& t : generator.layout().tensors()) {
    EXPECT_EQ(std::memcmp(generator.parameters() + t.offset, want.data() + t.offset,
                          size_t(t.numel) * sizeof(float)),
              0)
        << t.name << " is not this rank's generation slice of the single-rank model";
  }
  EXPECT_EQ(std::memcmp(slice.parameters(), before.data(), before.size() * sizeof(float)), 0)
      << "the switch changed the training slice";
  // Rank t needs training slices [(t % G) T / G, (t % G + 1) T / G) and sends its own to the
  // ranks needing it; every cut pack is the same size.
  uint64_t cut_bytes = 0;
  for (const ParameterRange& r : tensor_parallel_ranges(slice.layout()))
    cut_bytes += uint64_t(r.count) * sizeof(float);
  const RegroupPeers peers = regroup_peers(degree, generation_degree, tp.rank());
  EXPECT_EQ(received, peers.givers * cut_bytes);
  EXPECT_EQ(sent, peers.takers * cut_bytes);
  if (generation_degree == 1) {
    // The data-parallel switch moves the most: every other slice.
    EXPECT_EQ(received, uint64_t(degree - 1) * cut_bytes);
  }
  // Generation over the generation TP groups (each its own prompts) = the single-rank model's.
  std::vector<std::vector<int>> prompts;
  std::vector<int64_t> ids;
  for (int s = 0; s < 3; ++s) {
    prompts.push_back(test::random_ints(size_t(2 + s),
                                        seed + uint64_t(generation.replica()) * 7 + uint64_t(s), 0,
                                        config.vocab_size - 1));
    ids.push_back(int64_t(generation.replica()) * 100 + s);
  }
  test::expect_generation_like(generator, reference, prompts, ids, seed, 8);
}

TEST(TensorPipelineGeneration, RegroupToADividingDegreeGivesEveryRankItsSliceOfTheSingleRankModel) {
  const std::vector<int> degrees = tensor_degrees_for(test::world_size());
  if (degrees.empty()) GTEST_SKIP() << "TP on 2, 4 and 6 ranks";
  for (int degree : degrees) {
    for (int generation_degree = 1; generation_degree <= degree; ++generation_degree) {
      if (degree % generation_degree != 0) continue;
      check_regroup(degree, generation_degree);
      ASSERT_TRUE(test::on_every_rank(!::testing::Test::HasFailure()));
    }
  }
}

// Rank `rank`'s block of a step's samples: 2 prompts x 2 responses of varying lengths.
std::vector<Rollout> rank_block(int rank) {
  std::vector<Rollout> block;
  for (int i = 0; i < 4; ++i) {
    Rollout r;
    r.sample_id = int64_t(rank) * 4 + i;
    r.task_sample.id = r.sample_id / 2;
    r.prompt = {1, 2 + rank, 3};
    r.response = test::random_ints(size_t(1 + (rank + i) % 5), uint64_t(r.sample_id) + 11, 0, 9);
    r.behaviour_logp.assign(r.response.size(), -0.25f * float(i + 1));
    r.version_min = r.version_max = 3;
    r.reward = 0.5 * i;
    r.advantage = 0.125 * (i - rank);
    block.push_back(r);
  }
  return block;
}

TEST(TensorPipelineGeneration, TensorParallelGroupGathersItsRanksSamplesInOrder) {
  const std::vector<int> degrees = tensor_degrees_for(test::world_size());
  if (degrees.empty()) GTEST_SKIP() << "TP on 2, 4 and 6 ranks";
  const ModelConfig config = regroup_config();
  for (int degree : degrees) {
    SCOPED_TRACE("TP " + std::to_string(degree));
    Links links(test::virtual_node_list(test::world_size(), 1), {});
    TensorParallel tp(MPI_COMM_WORLD, degree, /*attention_only=*/false, config, links);
    const std::vector<Rollout> own = rank_block(test::world_rank());
    const uint64_t sent_before = test::link_bytes(links);
    const std::vector<Rollout> got = gather_tensor_parallel_rollouts(own, tp, 2);
    EXPECT_EQ(test::link_bytes(links) - sent_before,
              packed_bytes(to_queue_samples(own, 2)) * uint64_t(degree - 1));
    // The group's ranks' blocks in rank order: what DistQueue would hand the group.
    std::vector<QueueSample> want;
    for (int r = 0; r < degree; ++r) {
      const std::vector<QueueSample> block =
          to_queue_samples(rank_block(tp.replica() * degree + r), 2);
      want.insert(want.end(), block.begin(), block.end());
    }
    EXPECT_EQ(to_queue_samples(got, 2), want);
    ASSERT_TRUE(test::on_every_rank(!::testing::Test::HasFailure()));
  }
}

}  // namespace
}  // namespace rlf
