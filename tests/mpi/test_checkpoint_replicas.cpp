// Checkpoints of an expert-parallel group with replicas of hot experts (spare slots) and a
// migrated placement: the ranks write one file through parallel HDF5, each expert once (its first
// replica) by id, plus the placement and the rebalancer's state. Read whole it equals the whole
// model a single process holds; read back at the saved placement every slot, replicas included,
// gets its expert's bits; read at the default placement without spare slots (a resume into
// --redundant-experts 0) each rank gets its own experts.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "kernels/error.h"
#include "src/io/checkpoint.h"
#include "src/model/expert_parallel.h"
#include "src/model/parameter_layout.h"
#include "tests/mpi/checkpoint_test_util.h"
#include "tests/mpi/mpi_test_util.h"

namespace rlf {
namespace {

namespace fs = std::filesystem;

struct State {
  std::vector<float> parameters, first, second, reference;
  State(const ModelConfig& config, const ParameterLayout& layout)
      : parameters(size_t(layout.total())),
        first(parameters.size()),
        second(parameters.size()),
        reference(parameters.size()) {
    initialize_parameters(parameters.data(), layout, config, 21);
    initialize_parameters(first.data(), layout, config, 22);
    initialize_parameters(second.data(), layout, config, 23);
    initialize_parameters(reference.data(), layout, config, 24);
  }
  std::vector<std::vector<float>*> all() { return {&parameters, &first, &second, &reference}; }
  CheckpointTensors tensors() {
    return {parameters.data(), first.data(), second.data(), reference.data()};
  }
};

// Layer l's table over `size` ranks of `local` + `spare` slots: rank r's own slots hold experts
// (r local + j + l) mod E (every expert once, rotated by the layer), its spare slots replicas of
// the next experts (r local + local + i + l) mod E, which the rank does not hold otherwise.
std::vector<std::vector<int>> replica_tables(int layers, int E, int size, int spare) {
  const int local = E / size, slots = local + spare;
  std::vector<std::vector<int>> tables(size_t(layers), std::vector<int>(size_t(size * slots)));
  for (int l = 0; l < layers; ++l)
    for (int r = 0; r < size; ++r)
      for (int j = 0; j < slots; ++j)
        tables[size_t(l)][size_t(r * slots + j)] = (r * local + j + l) % E;
  return tables;
}

TEST(ReplicaCheckpoint, SavesPlacementAndReplicasAndLoadsAtAnyPlacement) {
  const ModelConfig config = test::twelve_experts();
  const int rank = test::world_rank(), size = test::world_size();
  const int E = config.n_experts, local = E / size;
  const int spare = std::min(2, E - local);  // no spare slot fits on one rank
  const ParameterLayout whole(config), slotted(config, {rank * local, local, spare});
  const int layers = expert_layers(whole);
  ASSERT_GE(layers, 2);
  const std::vector<std::vector<int>> tables = replica_tables(layers, E, size, spare);
  State expected(config, whole), mine(config, slotted);
  // Every slot of this rank, replicas included, from the whole model (replicas are bit-identical).
  for (int l = 0; l < layers; ++l) {
    for (int j = 0; j < local + spare; ++j) {
      const int slot = rank * (local + spare) + j, e = tables[size_t(l)][size_t(slot)];
      for (size_t b = 0; b < expected.all().size(); ++b) {
        unpack_ranges(pack_ranges(expected.all()[b]->data(), expert_slices(whole, e, 1, l)).data(),
                      expert_slices(slotted, slot, 1, l), mine.all()[b]->data());
      }
    }
  }
  CheckpointPlacement placement;
  placement.ep_degree = size;
  placement.slots_per_rank = local + spare;
  placement.slot_experts = tables;
  placement.has_rebalancer = true;
  for (int l = 0; l < layers; ++l) {
    placement.rebalancer.level.emplace_back(size_t(E), 0.0);
    placement.rebalancer.trend.emplace_back(size_t(E), 0.0);
    for (int e = 0; e < E; ++e) {
      placement.rebalancer.level[size_t(l)][size_t(e)] = 100.0 / (1 + e + l) + 1e-9;
      placement.rebalancer.trend[size_t(l)][size_t(e)] = -0.1 * e + 1.0 / 3.0;
    }
  }
  placement.rebalancer.predictor_steps = 7;
  placement.rebalancer.interval_seconds = 0.125;
  placement.rebalancer.interval_busiest_tokens = 4242;
  placement.rebalancer.migrations = 3;
  CheckpointTensors tensors = mine.tensors();
  tensors.slot_experts = &tables;
  tensors.placement = &placement;
  CheckpointCounters counters;
  counters.step = 4;
  counters.step_rewards = {0.1, 0.2, 0.3, 0.4};
  const std::string dir = test::shared_run_dir("rlfusion-mpi-ckpt-replicas");
  write_checkpoint_sharded(dir, config, slotted, counters, tensors, MPI_COMM_WORLD);
  const std::string path = checkpoint_path(dir, 4);

  // Read whole by every rank: the single-process model, bit for bit.
  State read_whole(config, whole);
  read_checkpoint(path, config, whole, read_whole.tensors());
  for (size_t b = 0; b < read_whole.all().size(); ++b)
    EXPECT_EQ(*read_whole.all()[b], *expected.all()[b]) << "buffer " << b;

  // The placement and rebalancer state come back exactly.
  const std::optional<CheckpointPlacement> saved = read_checkpoint_placement(path, config);
  ASSERT_TRUE(saved.has_value());
  EXPECT_EQ(*saved, placement);

  // At the saved placement every slot (replicas too) gets its expert's bits.
  State got(config, slotted);
  for (std::vector<float>* buffer : got.all()) std::fill(buffer->begin(), buffer->end(), 0.0f);
  CheckpointTensors into = got.tensors();
  into.slot_experts = &saved->slot_experts;
  read_checkpoint(path, config, slotted, into);
  for (size_t b = 0; b < got.all().size(); ++b)
    EXPECT_EQ(*got.all()[b], *mine.all()[b]) << "buffer " << b;

  // At the default placement without spare slots (resume with --redundant-experts 0): the rank's
  // own experts by id.
  const ParameterLayout own(config, {rank * local, local});
  State want(config, own), plain(config, own);
  for (std::vector<float>* buffer : plain.all()) std::fill(buffer->begin(), buffer->end(), 0.0f);
  read_checkpoint(path, config, own, plain.tensors());
  for (size_t b = 0; b < plain.all().size(); ++b)
    EXPECT_EQ(*plain.all()[b], *want.all()[b]) << "buffer " << b;
  // The test can fail: the placement's buffers differ from the default placement's.
  State identity(config, slotted);
  EXPECT_NE(identity.parameters, mine.parameters);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) fs::remove_all(dir);
}

// A placement whose tables do not hold every expert is refused when read (ConfigError naming the
// file), as a resume checks before any work.
TEST(ReplicaCheckpoint, RefusesAnInconsistentPlacement) {
  const ModelConfig config = test::twelve_experts();
  const int rank = test::world_rank(), size = test::world_size();
  const int E = config.n_experts, local = E / size;
  const ParameterLayout own(config, {rank * local, local});
  State mine(config, own);
  CheckpointPlacement placement;
  placement.ep_degree = size;
  placement.slots_per_rank = local;
  placement.slot_experts.assign(size_t(expert_layers(own)), std::vector<int>(size_t(E), 0));
  CheckpointTensors tensors = mine.tensors();
  tensors.placement = &placement;
  CheckpointCounters counters;
  counters.step = 1;
  counters.step_rewards = {0.5};
  const std::string dir = test::shared_run_dir("rlfusion-mpi-ckpt-replicas");
  write_checkpoint_sharded(dir, config, own, counters, tensors, MPI_COMM_WORLD);
  EXPECT_THROW(read_checkpoint_placement(checkpoint_path(dir, 1), config), ConfigError);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace rlf
