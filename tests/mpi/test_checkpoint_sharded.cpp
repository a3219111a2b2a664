// Sharded checkpoints (write_checkpoint_sharded): the ranks of the world, each storing its own
// experts, write one file through parallel HDF5; it equals the whole model a single process
// writes, and loads at any expert-parallel degree (each reader reads and checks only its rows).
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "src/io/checkpoint.h"
#include "src/model/expert_parallel.h"
#include "src/model/parameter_layout.h"
#include "tests/micro_model_config.h"
#include "tests/mpi/checkpoint_test_util.h"
#include "tests/mpi/mpi_test_util.h"

namespace rlf {
namespace {

namespace fs = std::filesystem;

// The three buffers a checkpoint holds, seeded so that a shard is the slice of the whole model.
struct State {
  std::vector<float> parameters, first, second;
  State(const ModelConfig& config, const ParameterLayout& layout)
      : parameters(size_t(layout.total())), first(parameters.size()), second(parameters.size()) {
    initialize_parameters(parameters.data(), layout, config, 11);
    initialize_parameters(first.data(), layout, config, 12);
    initialize_parameters(second.data(), layout, config, 13);
  }
  CheckpointTensors tensors() { return {parameters.data(), first.data(), second.data(), nullptr}; }
};

TEST(ShardedCheckpoint, EqualsTheWholeModelAndLoadsAtAnyExpertParallelDegree) {
  const ModelConfig config = test::twelve_experts();
  const int rank = test::world_rank(), size = test::world_size();
  const int local = config.n_experts / size;
  const ParameterLayout own(config, {rank * local, local});
  State mine(config, own);
  CheckpointCounters counters;
  counters.step = 3;
  counters.step_rewards = {0.25, 0.5, 0.75};
  counters.rl_seconds = 1.0 + rank;  // differs per rank: rank 0's is written
  const std::string dir = test::shared_run_dir("rlfusion-mpi-ckpt");
  write_checkpoint_sharded(dir, config, own, counters, mine.tensors(), MPI_COMM_WORLD);
  const std::string path = checkpoint_path(dir, 3);

  // Read whole (every rank), it is the whole model's state.
  const ParameterLayout whole(config);
  State expected(config, whole);
  State read_whole(config, whole);
  const CheckpointCounters c = read_checkpoint(path, config, whole, read_whole.tensors());
  EXPECT_EQ(read_whole.parameters, expected.parameters);
  EXPECT_EQ(read_whole.first, expected.first);
  EXPECT_EQ(read_whole.second, expected.second);
  EXPECT_EQ(c.rl_seconds, 1.0);
  EXPECT_EQ(c.step_rewards, counters.step_rewards);

  // Read at other degrees: one expert per rank, and the rank's own shard at the other end.
  for (const ExpertShard shard : {ExpertShard{rank % config.n_experts, 1},
                                  ExpertShard{config.n_experts - local * (rank + 1), local}}) {
    const ParameterLayout layout(config, shard);
    State want(config, layout);
    State got(config, layout);
    std::fill(got.parameters.begin(), got.parameters.end(), 0.0f);
    read_checkpoint(path, config, layout, got.tensors());
    EXPECT_EQ(got.parameters, want.parameters) << shard.first << "+" << shard.count;
    EXPECT_EQ(got.second, want.second) << shard.first << "+" << shard.count;
  }

  // Only the file, its checksum sidecar and `latest`: no temporary left behind.
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    EXPECT_TRUE(fs::exists(path + ".crc32c"));
    EXPECT_FALSE(fs::exists(path + ".tmp"));
    fs::remove_all(dir);
  }
}

// After expert migration a rank's slots hold any experts, each layer its own (here layer 0's slot
// s holds expert E - 1 - s, so every expert sits on another rank than at the start, and the other
// layers' slots are rotated by the layer index): the file still stores them by expert id, equal
// to the whole model, with per-expert checksums that a reader at the identity placement checks.
TEST(ShardedCheckpoint, WritesExpertsByIdAfterMigration) {
  const ModelConfig config = test::twelve_experts();
  const int rank = test::world_rank(), size = test::world_size();
  const int E = config.n_experts, local = E / size;
  const ParameterLayout whole(config), own(config, {rank * local, local});
  const int layers = expert_layers(whole);
  ASSERT_GE(layers, 2);
  std::vector<std::vector<int>> slot_of(static_cast<size_t>(layers),
                                        std::vector<int>(static_cast<size_t>(E)));
  for (int l = 0; l < layers; ++l) {
    for (int e = 0; e < E; ++e) slot_of[size_t(l)][size_t(e)] = l == 0 ? E - 1 - e : (e + l) % E;
  }
  State expected(config, whole), mine(config, own);
  // This rank's slots filled with the experts the tables put there, from the whole model.
  for (int l = 0; l < layers; ++l) {
    for (int e = 0; e < E; ++e) {
      const int s = slot_of[size_t(l)][size_t(e)];
      if (s / local != rank) continue;
      for (auto [from, to] :
           {std::pair{&expected.parameters, &mine.parameters},
            std::pair{&expected.first, &mine.first}, std::pair{&expected.second, &mine.second}}) {
        unpack_ranges(pack_ranges(from->data(), expert_slices(whole, e, 1, l)).data(),
                      expert_slices(own, s, 1, l), to->data());
      }
    }
  }
  CheckpointCounters counters;
  counters.step = 5;
  const std::string dir = test::shared_run_dir("rlfusion-mpi-ckpt");
  // The writers take the slot -> expert tables (the permutations' inverses).
  std::vector<std::vector<int>> slot_expert(slot_of.size(), std::vector<int>(size_t(E)));
  for (size_t l = 0; l < slot_of.size(); ++l)
    for (int e = 0; e < E; ++e) slot_expert[l][size_t(slot_of[l][size_t(e)])] = e;
  CheckpointTensors tensors = mine.tensors();
  tensors.slot_experts = &slot_expert;
  write_checkpoint_sharded(dir, config, own, counters, tensors, MPI_COMM_WORLD);
  const std::string path = checkpoint_path(dir, 5);
  State read_whole(config, whole);
  read_checkpoint(path, config, whole, read_whole.tensors());
  EXPECT_EQ(read_whole.parameters, expected.parameters);
  EXPECT_EQ(read_whole.first, expected.first);
  EXPECT_EQ(read_whole.second, expected.second);
  // A resumed rank reads its identity-placement shard (and checks its experts' checksums).
  State want(config, own), got(config, own);
  read_checkpoint(path, config, own, got.tensors());
  EXPECT_EQ(got.parameters, want.parameters);
  EXPECT_EQ(got.second, want.second);
  // Without the table the same buffers would land on the wrong experts (the test can fail).
  EXPECT_NE(mine.parameters, want.parameters);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) fs::remove_all(dir);
}

// The readable reference of a slice: element i of each tensor from its source element.
void element_by_element_slice(const std::vector<float>& whole, const ParameterLayout& uncut,
                              std::vector<float>& slice, const ParameterLayout& sliced) {
  for (size_t k = 0; k < sliced.tensors().size(); ++k) {
    const ParameterTensor& t = sliced.tensors()[k];
    const int64_t from = uncut.tensors()[k].offset;
    const bool cut = t.tp_split != ParameterTensor::TensorSplit::None;
    for (int64_t i = 0; i < t.numel; ++i) {
      slice[size_t(t.offset + i)] = whole[size_t(from + (cut ? t.source_element(i) : i))];
    }
  }
}

// A tensor-parallel reader (any TP degree dividing the heads, attention only or not, with an
// expert shard and a pipeline stage's layers) gets exactly its slice of the whole model's buffers:
// read_checkpoint copies each cut tensor's slice straight from the file (no whole-model buffer),
// checking the whole tensor's checksum.
TEST(ShardedCheckpoint, LoadsATensorParallelSliceOfEveryTensor) {
  ModelConfig config = test::tensor_parallel_micro_config(3);
  config.n_experts = 12;
  config.validate("test");
  const int rank = test::world_rank();
  const int local = config.n_experts / test::world_size();
  const ExpertShard experts{rank * local, local};
  State mine(config, ParameterLayout(config, experts));
  const std::string dir = test::shared_run_dir("rlfusion-mpi-ckpt");
  CheckpointCounters counters;
  counters.step = 4;
  write_checkpoint_sharded(dir, config, ParameterLayout(config, experts), counters, mine.tensors(),
                           MPI_COMM_WORLD);
  const std::string path = checkpoint_path(dir, 4);

  const LayerShard stage{{1, 2}, /*embedding=*/false, /*head=*/true};
  for (const int degree : {2, 3}) {
    for (const bool attention_only : {false, true}) {
      for (const LayerShard& layers : {LayerShard{}, stage}) {
        const TensorSlice slice{rank % degree, degree, attention_only};
        const ParameterLayout uncut(config, experts, layers);
        const ParameterLayout sliced(config, experts, layers, slice);
        State whole(config, uncut), want(config, sliced), got(config, sliced);
        element_by_element_slice(whole.parameters, uncut, want.parameters, sliced);
        element_by_element_slice(whole.first, uncut, want.first, sliced);
        element_by_element_slice(whole.second, uncut, want.second, sliced);
        for (std::vector<float>* b : {&got.parameters, &got.first, &got.second}) {
          std::fill(b->begin(), b->end(), 0.0f);
        }
        read_checkpoint(path, config, sliced, got.tensors());
        const std::string where = "TP " + std::to_string(slice.rank) + " of " +
                                  std::to_string(degree) + (attention_only ? " attention" : "") +
                                  (layers.layers.empty() ? "" : " stage");
        EXPECT_EQ(got.parameters, want.parameters) << where;
        EXPECT_EQ(got.first, want.first) << where;
        EXPECT_EQ(got.second, want.second) << where;
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace rlf
