// Helpers of the MPI checkpoint tests of model-parallel layouts: a training state's buffers
// filled with distinct random values, compared tensor by tensor, a run directory shared by every
// rank, and a checkpoint written through TrainCheckpoints and read back.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "src/app/train_checkpoints.h"
#include "src/io/checkpoint.h"
#include "src/io/run_directory.h"
#include "src/model/parameter_layout.h"
#include "tests/mpi/mpi_test_util.h"

namespace rlf::test {

// `values` over every tensor of `layout`, each element from `gen`; alignment gaps stay zero.
inline void fill_tensors(float* values, const ParameterLayout& layout, std::mt19937& gen,
                         bool positive) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::fill_n(values, layout.total(), 0.0f);
  for (const ParameterTensor& t : layout.tensors()) {
    for (int64_t i = 0; i < t.numel; ++i) {
      const float x = normal(gen);
      values[t.offset + i] = positive ? x * x : x;
    }
  }
}

// Whether `a` and `b` (both laid out by `layout`) hold the same bits in every tensor.
inline bool same_tensors(const float* a, const float* b, const ParameterLayout& layout) {
  for (const ParameterTensor& t : layout.tensors()) {
    if (std::memcmp(a + t.offset, b + t.offset, size_t(t.numel) * sizeof(float)) != 0) return false;
  }
  return true;
}

// A run directory with the same name on every rank, emptied by rank 0.
inline std::string shared_run_dir(const std::string& name) {
  int pid = int(getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("rlfusion-mpi-" + name + "-" + std::to_string(pid)))
                              .string();
  if (world_rank() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

// The four buffers of a checkpoint, in its order.
constexpr const char* kCheckpointBuffers[] = {"parameters", "first moment", "second moment",
                                              "reference"};

// The settings the tests write with: a KL term, so the file holds the reference too.
inline RlOptions checkpoint_test_rl() {
  RlOptions rl;
  rl.steps = 4;
  rl.prompts = 4;
  rl.group_size = 2;
  rl.kl_coef = 0.1f;
  return rl;
}

// Every rank saves `state` as step 1's checkpoint through TrainCheckpoints (`attach` gives it the
// layout: pipelines, TP; `ep` the sharded experts), then reads the whole file back and expects
// each buffer to be `whole`'s (the single-rank buffers, laid out by `whole_layout`) bit for bit.
// Returns the file.
inline std::string expect_checkpoint_holds(const RunOptions& run, const ModelConfig& config,
                                           const TrainingState& state, RoleExpertParallel* ep,
                                           const std::function<void(TrainCheckpoints&)>& attach,
                                           const std::array<float*, 4>& whole,
                                           const ParameterLayout& whole_layout) {
  const bool root = world_rank() == 0;
  const RlOptions rl = checkpoint_test_rl();
  {
    CheckpointOptions every_step;
    every_step.every = 1;
    TrainCheckpoints saved(every_step, run, rl, config, /*supported=*/true);
    attach(saved);
    RunDirectory dir(run.run_dir, "", root);
    RlPosition position;
    position.step_rewards = {0.25};
    EXPECT_FALSE(saved.end_of_step(1, position, 0.0, state, root, ep, MPI_COMM_WORLD, dir));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string path = checkpoint_path(run.run_dir, 1);
  std::array<std::vector<float>, 4> read;
  for (std::vector<float>& buffer : read) buffer.resize(size_t(whole_layout.total()));
  const CheckpointCounters counters = read_checkpoint(
      path, config, whole_layout, {read[0].data(), read[1].data(), read[2].data(), read[3].data()});
  EXPECT_EQ(counters.step, 1);
  for (size_t b = 0; b < 4; ++b) {
    EXPECT_TRUE(same_tensors(read[b].data(), whole[b], whole_layout))
        << "the file's " << kCheckpointBuffers[b] << " are not the single-rank ones";
  }
  return path;
}

// Every rank loads `path` into `restored` (whose buffers are `buffers`, laid out by `layout`)
// through TrainCheckpoints and expects each buffer to be `want`'s, then rank 0 removes the run
// directory.
inline void expect_checkpoint_loads(const std::string& path, const RunOptions& run,
                                    const ModelConfig& config, const TrainingState& restored,
                                    const std::function<void(TrainCheckpoints&)>& attach,
                                    const std::array<float*, 4>& buffers,
                                    const std::array<const float*, 4>& want,
                                    const ParameterLayout& layout) {
  CheckpointOptions resume;
  resume.resume = path;
  const RlOptions rl = checkpoint_test_rl();
  TrainCheckpoints loaded(resume, run, rl, config, /*supported=*/true);
  attach(loaded);
  EXPECT_EQ(loaded.load(restored).step, 1);
  for (size_t b = 0; b < 4; ++b) {
    EXPECT_TRUE(same_tensors(buffers[b], want[b], layout))
        << "the loaded " << kCheckpointBuffers[b] << " are not this rank's part";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(run.run_dir);
}

}  // namespace rlf::test
