// Checkpoints and restart: the CRC-64 and the file format on their own, then the rlfusion binary
// on one rank, two (disaggregated, fused, PP, TP) and four (sharded experts, TP x PP, PP x EP,
// TP x EP): a run killed with SIGKILL in the middle of writing a checkpoint resumes from the
// previous one and ends bit for bit where an uninterrupted run does; SIGUSR1 / SIGTERM checkpoint
// and stop with exit code 3; damaged, truncated and wrong-shape files are refused with exit code 2
// (or skipped by --resume auto).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/error.h"
#include "src/io/checkpoint.h"
#include "src/io/durable_file.h"
#include "src/model/model_config.h"
#include "tests/app/fused_train_runs.h"
#include "tests/app/json_output.h"
#include "tests/app/read_parameters.h"
#include "tests/app/run_rlfusion.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

namespace fs = std::filesystem;
using test::CommandResult;

// Unique per test process: two checkouts testing at once (or a rerun while one hangs) never
// share a run directory.
std::string temp_dir_name(const std::string& name) {
  return (fs::temp_directory_path() /
          ("rlfusion-checkpoints-" + name + "-" + std::to_string(getpid())))
      .string();
}

// temp_dir_name, emptied.
std::string temp_dir(const std::string& name) {
  const std::string dir = temp_dir_name(name);
  fs::remove_all(dir);
  return dir;
}

std::string train_args(int steps = 6, const std::string& model = "tiny") {
  return "train --model " + model +
         " --task sort --sft-steps 30 --sft-learning-rate 0.01 --steps " + std::to_string(steps) +
         " --prompts 4 --group-size 4 --eval-prompts 16 --kl-coef 0.01 --log-every 1 --json ";
}
const std::string kRun = train_args();

std::string summary_line(const std::string& output, const std::string& row) {
  const auto at = output.find(row);
  return at == std::string::npos ? "" : output.substr(at, output.find('\n', at) - at);
}

// The same final weights, held-out accuracies and per-step rewards (summary rows).
void expect_same_run(const CommandResult& straight, const std::string& straight_dir,
                     const CommandResult& resumed, const std::string& resumed_dir) {
  EXPECT_EQ(test::read_saved_parameters(straight_dir + "/model.h5"),
            test::read_saved_parameters(resumed_dir + "/model.h5"));
  for (const char* key : {"heldout_accuracy_before_rl", "heldout_accuracy_after_rl"}) {
    EXPECT_EQ(test::json_number(straight.output, key), test::json_number(resumed.output, key))
        << key;
  }
  for (const char* row : {"mean reward, first 10%", "mean reward, last 10%"}) {
    if (summary_line(straight.output, row).empty()) continue;  // (multi-rank summaries)
    EXPECT_EQ(summary_line(straight.output, row), summary_line(resumed.output, row)) << row;
  }
}

// Runs `args` straight into one directory and, into another, killed by SIGKILL while writing
// checkpoint 4 (`where`: data or renamed), then resumed with --resume auto.
// `about_straight`, when given, also checks the uninterrupted run's output.
void expect_kill_and_resume_bit_exact(
    const std::string& name, int ranks, const std::string& args, const std::string& where,
    const std::function<void(const CommandResult&)>& about_straight = nullptr) {
  const std::string straight_dir = temp_dir(name + "-straight");
  const std::string dir = temp_dir(name + "-killed");
  const CommandResult straight = test::run_rlfusion(args + "--run-dir " + straight_dir, ranks);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  if (about_straight) about_straight(straight);
  const std::string hook = where == "data" ? "4" : "4:" + where;
  const CommandResult killed =
      test::run_rlfusion(args + "--checkpoint-every 2 --run-dir " + dir, ranks,
                         "RLFUSION_TEST_KILL_IN_CHECKPOINT=" + hook);
  ASSERT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_FALSE(fs::exists(dir + "/summary.json"));
  EXPECT_EQ(read_text(dir + "/checkpoints/latest"), "step_000002.h5\n");
  EXPECT_NO_THROW(verify_checkpoint_file(checkpoint_path(dir, 2)));
  const CommandResult resumed =
      test::run_rlfusion(args + "--checkpoint-every 2 --resume auto --run-dir " + dir, ranks);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from checkpoint " + checkpoint_path(dir, 2)),
            std::string::npos)
      << resumed.output;
  expect_same_run(straight, straight_dir, resumed, dir);
}

TEST(Checkpoint, RoundTripsEveryBufferAndCounter) {
  const std::string dir = temp_dir("round-trip");
  const ModelConfig config =
      load_model_config(std::string(RLFUSION_SOURCE_DIR) + "/inputs/models/tiny.ini");
  const ParameterLayout layout(config);
  const size_t n = size_t(layout.total());
  std::vector<std::vector<float>> buffers(4, std::vector<float>(n));
  for (size_t b = 0; b < 4; ++b) {
    for (size_t i = 0; i < n; ++i) buffers[b][i] = float(b) + 1e-3f * float(i % 977);
  }
  CheckpointCounters c;
  c.step = 3;
  c.optimizer_steps = 7;
  c.rl_tokens = 12345;
  c.rl_seconds = 1.5;
  c.initial_prompts = c.before_rl_prompts = 16;
  c.initial_correct = 2;
  c.before_rl_correct = 5;
  c.step_rewards = {0.25, 0.5, 0.125};
  c.seed = 0xFFFFFFFFFFFFFFF1ull;
  c.prompts = 4;
  c.group_size = 8;
  write_checkpoint(dir, config, layout, c,
                   {buffers[0].data(), buffers[1].data(), buffers[2].data(), buffers[3].data()});
  std::vector<std::vector<float>> read(4, std::vector<float>(n));
  const CheckpointCounters r =
      read_checkpoint(checkpoint_path(dir, 3), config, layout,
                      {read[0].data(), read[1].data(), read[2].data(), read[3].data()});
  EXPECT_EQ(read, buffers);
  EXPECT_EQ(r.step, 3);
  EXPECT_EQ(r.optimizer_steps, 7);
  EXPECT_EQ(r.rl_tokens, 12345);
  EXPECT_EQ(r.step_rewards, c.step_rewards);
  EXPECT_EQ(r.seed, c.seed);
  EXPECT_EQ(r.before_rl_correct, 5);
  // Without a reference buffer the file (which holds one) is refused.
  EXPECT_THROW(read_checkpoint(checkpoint_path(dir, 3), config, layout,
                               {read[0].data(), read[1].data(), read[2].data(), nullptr}),
               ConfigError);
  // The checkpoint is also a policy parameter file.
  EXPECT_EQ(test::read_tiny_parameters(checkpoint_path(dir, 3)), buffers[0]);
}

// A checkpoint file changed after it was written, with its sidecar made to match again (so the
// whole-file CRC passes): the per-dataset CRC-32Cs still catch a changed tensor.
void rewrite_sidecar(const std::string& path) {
  char text[64];
  std::snprintf(text, sizeof text, "crc32c %08x bytes %llu\n", (unsigned)file_crc32c(path),
                (unsigned long long)fs::file_size(path));
  std::ofstream(path + ".crc32c", std::ios::trunc) << text;
}

void overwrite_dataset(const std::string& path, const std::string& dataset, float value) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t set = H5Dopen2(file, dataset.c_str(), H5P_DEFAULT);
  ASSERT_GE(set, 0) << dataset;
  const hid_t space = H5Dget_space(set);
  std::vector<float> values(size_t(H5Sget_simple_extent_npoints(space)), value);
  EXPECT_GE(H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  H5Sclose(space);
  H5Dclose(set);
  H5Fclose(file);
  rewrite_sidecar(path);
}

// Checkpoints store tensors contiguously, and the reader copies those from the verified mapping
// of the file; a dataset stored otherwise (here chunked by h5repack) is read through HDF5. Both
// paths check every dataset's CRC-32C.
TEST(Checkpoint, ContiguousAndChunkedDatasetsAreReadAndChecked) {
  const std::string dir = temp_dir("chunked");
  const ModelConfig config =
      load_model_config(std::string(RLFUSION_SOURCE_DIR) + "/inputs/models/tiny.ini");
  const ParameterLayout layout(config);
  const size_t n = size_t(layout.total());
  std::mt19937 random(std::random_device{}());
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> buffers(3, std::vector<float>(n));
  for (auto& buffer : buffers)
    for (float& x : buffer) x = normal(random);
  CheckpointCounters c;
  c.step = 1;
  c.step_rewards = {0.5};
  write_checkpoint(dir, config, layout, c,
                   {buffers[0].data(), buffers[1].data(), buffers[2].data(), nullptr});
  const std::string written = checkpoint_path(dir, 1), chunked = dir + "/chunked.h5";
  ASSERT_EQ(std::system(("h5repack -l /parameters/embedding:CHUNK=8x8 -l "
                         "/parameters/layers.0.experts.w1:CHUNK=1x8x8 " +
                         written + " " + chunked)
                            .c_str()),
            0);
  rewrite_sidecar(chunked);
  std::vector<std::vector<float>> read(3, std::vector<float>(n));
  const auto read_back = [&](const std::string& path) {
    read_checkpoint(path, config, layout,
                    {read[0].data(), read[1].data(), read[2].data(), nullptr});
  };
  read_back(chunked);
  EXPECT_EQ(read, buffers);
  // A changed chunked tensor and a changed contiguous one: each refused by its own CRC.
  for (const char* dataset : {"/parameters/embedding", "/parameters/final_norm"}) {
    fs::copy_file(chunked, dir + "/changed.h5", fs::copy_options::overwrite_existing);
    overwrite_dataset(dir + "/changed.h5", dataset, 0.5f);
    try {
      read_back(dir + "/changed.h5");
      ADD_FAILURE() << dataset << " changed, read without an error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("does not match its checksum"), std::string::npos)
          << e.what();
    }
  }
}

TEST(Checkpoint, OneRankResumeAfterSigkillInTheMiddleOfAWriteIsBitExact) {
  expect_kill_and_resume_bit_exact("one-rank-data", 0, kRun, "data");
}

TEST(Checkpoint, ResumeAfterSigkillBetweenRenameAndChecksumIsBitExact) {
  expect_kill_and_resume_bit_exact("one-rank-renamed", 0, kRun, "renamed");
}

TEST(Checkpoint, TwoRanksDisaggregatedResumeIsBitExact) {
  expect_kill_and_resume_bit_exact("two-ranks", 2, kRun + "--ranks-per-node 1 ", "data");
}

// Sharded experts: gathered whole on learner 0 for the file, read back shard by shard.
TEST(Checkpoint, ExpertParallelLearnersAndActorsResumeIsBitExact) {
  expect_kill_and_resume_bit_exact("expert-parallel", 4,
                                   kRun + "--learners 2 --actors 2 --expert-parallel 2 ", "data");
}

// Fused ranks (RL Fusion) with sharded experts and the training state offloaded during
// generation.
TEST(Checkpoint, FusedExpertParallelWithOffloadResumeIsBitExact) {
  expect_kill_and_resume_bit_exact("fused", 2, kRun + "--mode fused --expert-parallel 2 --offload ",
                                   "data");
}

// Fused StaleSync: each rank's rollout pool (the next step's prompts under way, partials cut by
// the long-tail threshold) is saved with the checkpoint and refilled on resume.
TEST(Checkpoint, FusedStaleSyncResumeWithSamplesInFlightIsBitExact) {
  const std::string extra = "--mode fused --staleness 1 --finish-threshold 0.75 ";
  expect_kill_and_resume_bit_exact("fused-stale", 2, kRun + extra, "data");
  // What the checkpoint held: both ranks' samples in flight, some of them partial.
  const std::string path = checkpoint_path(temp_dir_name("fused-stale-killed"), 2);
  int partial = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<InFlightSample> samples = read_in_flight(path, rank);
    EXPECT_FALSE(samples.empty()) << rank;
    for (const InFlightSample& s : samples) partial += !s.finished && !s.response.empty();
  }
  EXPECT_GT(partial, 0);
  // Resumed on another rank count: refused before any work.
  const CommandResult other = test::run_rlfusion(
      kRun + extra + "--resume " + path + " --run-dir " + temp_dir("fused-stale-4"), 4);
  EXPECT_EQ(other.exit_code, kExitConfigError) << other.output;
  EXPECT_NE(other.output.find("resume with the layout it was written with"), std::string::npos)
      << other.output;
}

// The same with sharded experts: the pools travel to world rank 0, which writes them into the
// file the EP group writes together.
TEST(Checkpoint, FusedStaleSyncWithExpertParallelismResumeIsBitExact) {
  expect_kill_and_resume_bit_exact(
      "fused-stale-ep", 2,
      kRun + "--mode fused --expert-parallel 2 --staleness 1 --finish-threshold 0.75 ", "data");
}

// `layout` on 4 ranks with a skewed router and a migration decision after every step with no
// threshold: the decisions do not depend on timing (any predicted gain beats a zero threshold), so
// the killed run migrates where the straight one does: before the checkpoint of step 2, whose
// experts are then not contiguous per rank.
void expect_kill_and_resume_after_migration_bit_exact(const std::string& name,
                                                      const std::string& layout) {
  expect_kill_and_resume_bit_exact(
      name, 4, kRun + layout + "--router-skew 4 --rebalance-every 1 --rebalance-min-gain 0 ",
      "data", [](const CommandResult& straight) {
        EXPECT_TRUE(straight.output.find("# migration after step 1:") != std::string::npos ||
                    straight.output.find("# migration after step 2:") != std::string::npos)
            << straight.output;
      });
}

// Learners that migrate experts every step (skewed router, no threshold) checkpoint after a
// migration: the file holds the experts by id and the placement beside them, the resumed run
// continues at that placement with the rebalancer's state, and ends bit for bit where the
// uninterrupted run does.
TEST(CheckpointRestart, ExpertParallelAfterMigrationResumesBitExact) {
  expect_kill_and_resume_after_migration_bit_exact("ep-migrated",
                                                   "--learners 2 --actors 2 --expert-parallel 2 ");
}

// Replicas of hot experts (--redundant-experts 1, rebalancing after every step at the default
// counted rates and threshold): the checkpoint holds every expert once by id, the slot tables
// (replicas included) and the rebalancer's predictors and interval; a run killed while writing
// checkpoint 4 resumes from checkpoint 2 at its placement and ends bit for bit where the
// uninterrupted run does (at the default placement the replicas' token split, and so the math,
// would differ). Disaggregated learners (EP 2 x 1 with 2 actors) and fused ranks (EP 2, generation
// on the training layout or through the layout switch).
// `ranks` 0: 4 for disaggregated learners and actors, 2 fused.
void expect_replica_resume_bit_exact(const std::string& name, const std::string& layout,
                                     int ranks = 0) {
  SCOPED_TRACE(name);
  const std::string args =
      kRun + layout + "--router-skew 4 --redundant-experts 1 --rebalance-every 1 ";
  if (ranks == 0) ranks = layout.find("fused") == std::string::npos ? 4 : 2;
  expect_kill_and_resume_bit_exact(name, ranks, args, "data", [](const CommandResult& straight) {
    EXPECT_NE(straight.output.find("# migration after step 1:"), std::string::npos)
        << straight.output;
  });
  const std::string dir = temp_dir_name(name + "-killed");
  const std::optional<CheckpointPlacement> saved =
      read_checkpoint_placement(checkpoint_path(dir, 2), load_model_config("tiny"));
  ASSERT_TRUE(saved.has_value());
  EXPECT_EQ(saved->ep_degree, 2);
  EXPECT_TRUE(saved->has_rebalancer);
  EXPECT_EQ(saved->rebalancer.predictor_steps, 2);
  EXPECT_GT(saved->rebalancer.migrations, 0);
  // The saved tables hold a replica (an expert in two slots), so the placement mattered.
  bool replicated = false;
  for (const std::vector<int>& table : saved->slot_experts) {
    std::vector<int> sorted = table;
    std::sort(sorted.begin(), sorted.end());
    replicated = replicated || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end();
  }
  EXPECT_TRUE(replicated);
}

TEST(CheckpointRestart, ReplicasResumeBitExact) {
  expect_replica_resume_bit_exact("replicas", "--learners 2 --actors 2 --expert-parallel 2 ");
  expect_replica_resume_bit_exact("replicas-fused", "--mode fused --expert-parallel 2 ");
  // Generation through the layout switch (EP 2 -> 1), which follows the adopted tables.
  expect_replica_resume_bit_exact("replicas-fused-switch",
                                  "--mode fused --expert-parallel 2 --actor-expert-parallel 1 ");
  // TP 2 x EP 2: TP rank 0's EP group writes each expert once by id and the slot tables.
  expect_replica_resume_bit_exact("replicas-tensor",
                                  "--mode fused --tensor-parallel 2 --expert-parallel 2 ", 4);
  // PP 2 x EP 2: the first stages' EP group writes each expert once by id with every layer's
  // tables; every stage's EP group adopts them on resume.
  expect_replica_resume_bit_exact("replicas-pipeline",
                                  "--mode fused --pipeline-parallel 2 --expert-parallel 2 ", 4);
}

// A checkpoint with replicas resumes without them (--redundant-experts 0) and at another EP
// degree: at the default placement, the experts read by id, and the log says so.
TEST(CheckpointRestart, ReplicaCheckpointResumesWithoutReplicas) {
  const std::string dir = temp_dir("replicas-written");
  const std::string fused = kRun + "--mode fused --router-skew 4 --rebalance-every 1 ";
  const CommandResult written = test::run_rlfusion(
      fused + "--expert-parallel 2 --redundant-experts 1 --checkpoint-every 2 --run-dir " + dir, 2);
  ASSERT_EQ(written.exit_code, 0) << written.output;
  for (const auto& [layout, ranks] : std::vector<std::pair<std::string, int>>{
           {"--expert-parallel 2 ", 2}, {"--learners 1 --actors 1 ", 2}}) {
    SCOPED_TRACE(layout);
    const std::string run = layout.find("learners") == std::string::npos
                                ? fused + layout
                                : kRun + "--router-skew 4 " + layout;
    const CommandResult resumed = test::run_rlfusion(
        run + "--resume " + checkpoint_path(dir, 4) + " --run-dir " + temp_dir("replicas-into"),
        ranks);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("resuming from checkpoint"), std::string::npos);
    if (layout.find("expert-parallel") != std::string::npos) {
      EXPECT_NE(resumed.output.find("resuming at the default placement"), std::string::npos)
          << resumed.output;
    }
  }
}

// Pipeline parallelism (the KL term on: the reference is stored per stage too): the first
// pipeline gathers its stages' parameters, moments and reference into the whole-model file, and
// a resumed run ends bit for bit where the uninterrupted one does, at PP 2 and at PP 2 x DP 2.
TEST(Checkpoint, FusedPipelineParallelResumeIsBitExact) {
  const std::string pipeline = kRun + "--mode fused --pipeline-parallel 2 ";
  expect_kill_and_resume_bit_exact("pipeline", 2, pipeline, "data");
  expect_kill_and_resume_bit_exact("pipeline-dp", 4, pipeline, "data");
}

// PP x EP (the KL term on): the first EP replica's pipelines gather their stages and their first
// stages write the experts' rows together; every rank reads back its stage's layers and its
// experts' rows, and a resumed run ends bit for bit where the uninterrupted one does (PP 2 x EP 2
// on 4 ranks).
TEST(Checkpoint, FusedPipelineExpertParallelResumeIsBitExact) {
  expect_kill_and_resume_bit_exact("pipeline-experts", 4,
                                   kRun + "--mode fused --pipeline-parallel 2 --expert-parallel 2 ",
                                   "data");
}

// The same after migrations: every stage's EP group moved its own layer's experts (skewed router,
// no threshold) before the checkpoint of step 2, which holds the experts by id and every layer's
// tables; the resumed run continues at that placement and ends bit for bit where the
// uninterrupted one does.
TEST(CheckpointRestart, PipelineExpertParallelAfterMigrationResumesBitExact) {
  expect_kill_and_resume_after_migration_bit_exact(
      "pipeline-experts-migrated", "--mode fused --pipeline-parallel 2 --expert-parallel 2 ");
}

// TP 2 x EP 2 on 4 ranks after migrations: both TP ranks' EP groups moved the same experts before
// the checkpoint of step 2; TP rank 0's EP group writes them by id with the placement, and the
// resumed run ends bit for bit where the uninterrupted one does.
TEST(CheckpointRestart, TensorExpertParallelAfterMigrationResumesBitExact) {
  expect_kill_and_resume_after_migration_bit_exact(
      "tensor-experts-migrated", "--mode fused --tensor-parallel 2 --expert-parallel 2 ");
}

// Tensor parallelism (the KL term on: the reference is sliced too): the first TP group (with
// pipelines, the first TP x PP replica) gathers its ranks' slices of the parameters, moments and
// reference into the whole-model file, each rank loads back its slice, and a resumed run ends bit
// for bit where the uninterrupted one does, at TP 2 on 2 ranks and TP 2 x PP 2 on 4.
TEST(Checkpoint, FusedTensorParallelResumeIsBitExact) {
  const std::string tensor = kRun + "--mode fused --tensor-parallel 2 ";
  expect_kill_and_resume_bit_exact("tensor", 2, tensor, "data");
  expect_kill_and_resume_bit_exact("tensor-pipeline", 4, tensor + "--pipeline-parallel 2 ", "data");
}

// Fused StaleSync with TP (TP 2 x 2 replicas): every rank's pool is saved (a TP group's ranks hold
// alike ones) and each rank refills its own on resume; with --offload the training state of the
// slices leaves the arena every phase as well.
TEST(Checkpoint, FusedTensorParallelStaleSyncWithOffloadResumeIsBitExact) {
  expect_kill_and_resume_bit_exact(
      "tensor-stale", 4,
      kRun + "--mode fused --tensor-parallel 2 --staleness 1 --finish-threshold 0.75 --offload ",
      "data");
  // The checkpoint held every rank's samples in flight, alike within each TP group.
  const std::string path = checkpoint_path(temp_dir_name("tensor-stale-killed"), 2);
  for (int rank = 0; rank < 4; rank += 2) {
    const std::vector<InFlightSample> leader = read_in_flight(path, rank);
    EXPECT_FALSE(leader.empty()) << rank;
    EXPECT_TRUE(read_in_flight(path, rank + 1) == leader) << rank;
  }
}

// Fused StaleSync with pipelines: every rank's own pool (generation is data-parallel) is saved and
// refilled; PP 2 with --offload on 2 ranks, TP 2 x PP 2 and PP 2 x EP 2 on 4, and the interleaved
// schedule (PP 2
// with 2 virtual stages of the 4-layer tiny in pieces of 3 samples, split into even counts) on 2.
TEST(Checkpoint, FusedPipelineParallelStaleSyncResumeIsBitExact) {
  const std::string stale_options = "--mode fused --staleness 1 --finish-threshold 0.75 ";
  const std::string stale = kRun + stale_options;
  expect_kill_and_resume_bit_exact("pipeline-stale", 2, stale + "--pipeline-parallel 2 --offload ",
                                   "data");
  expect_kill_and_resume_bit_exact("tensor-pipeline-stale", 4,
                                   stale + "--tensor-parallel 2 --pipeline-parallel 2 ", "data");
  // PP x EP: the first stages' EP group writes the file, world rank 0 the pools with it.
  expect_kill_and_resume_bit_exact(
      "pipeline-experts-stale", 4,
      stale + "--pipeline-parallel 2 --expert-parallel 2 --micro-batch 4 ", "data");
  expect_kill_and_resume_bit_exact("interleaved-stale", 2,
                                   train_args(6, test::write_tiny4_model(temp_dir("tiny4-stale"))) +
                                       stale_options +
                                       "--pipeline-parallel 2 --virtual-stages 2 --micro-batch 3 ",
                                   "data");
  // Generating inside the pipelines: each rank's pool a lane of its pipeline, saved and restored
  // as the data-parallel generation's (with TP and EP inside the stages too).
  expect_kill_and_resume_bit_exact("pipeline-inside-stale", 2,
                                   stale + "--pipeline-parallel 2 --actor-pipeline-parallel 2 ",
                                   "data");
  expect_kill_and_resume_bit_exact("pipeline-experts-inside-stale", 4,
                                   stale +
                                       "--pipeline-parallel 2 --expert-parallel 2 --micro-batch 4 "
                                       "--actor-pipeline-parallel 2 ",
                                   "data");
}

// Training at TP 1 generating at TP 2 with StaleSync: each generation group's ranks hold the same
// pool, each rank's saved and restored with the checkpoint. Data-parallel training (each rank
// cuts its slice), EP 2 training (the TP groups across the EP groups) and PP 2 x DP 2 (each stage
// receives its slice of the other) on 4 ranks.
TEST(Checkpoint, GenerationAtATensorParallelDegreeOfItsOwnStaleSyncResumeIsBitExact) {
  const std::string stale = kRun + "--mode fused --staleness 1 --finish-threshold 0.75 ";
  expect_kill_and_resume_bit_exact("generation-tp-stale", 4, stale + "--actor-tensor-parallel 2 ",
                                   "data");
  expect_kill_and_resume_bit_exact("pipeline-generation-tp-stale", 4,
                                   stale + "--pipeline-parallel 2 --actor-tensor-parallel 2 ",
                                   "data");
  expect_kill_and_resume_bit_exact("expert-generation-tp-stale", 4,
                                   stale + "--expert-parallel 2 --actor-tensor-parallel 2 ",
                                   "data");
}

// The file is the whole model whatever wrote it: a checkpoint of the fused run with
// `model_parallel` (its options) on `ranks` ranks resumes in a data-parallel fused run on
// `data_parallel_ranks` (as many replicas, so the same samples and the same math) and the other
// way round, ending where an uninterrupted run of the resuming layout does (within float rounding:
// the two layouts sum in different orders).
// `other`: the options of the other layout (default: none, plain data parallelism); `run`: the
// training run both layouts make (default kRun); `mode`: both layouts' --mode.
void expect_resumes_in_data_parallel_and_back(const std::string& name,
                                              const std::string& model_parallel, int ranks,
                                              int data_parallel_ranks,
                                              const std::string& other = "",
                                              const std::string& run = kRun,
                                              const std::string& mode = "fused") {
  const std::string data_parallel = run + "--mode " + mode + " " + other;
  const std::string layout = run + "--mode " + mode + " " + model_parallel;
  for (const bool model_parallel_writes : {true, false}) {
    SCOPED_TRACE(model_parallel + (model_parallel_writes ? "-> DP" : "<- DP"));
    const std::string& writer = model_parallel_writes ? layout : data_parallel;
    const std::string& reader = model_parallel_writes ? data_parallel : layout;
    const int writer_ranks = model_parallel_writes ? ranks : data_parallel_ranks;
    const int reader_ranks = model_parallel_writes ? data_parallel_ranks : ranks;
    const std::string written_dir = temp_dir(name + "-written");
    const std::string straight_dir = temp_dir(name + "-straight");
    const std::string resumed_dir = temp_dir(name + "-resumed");
    const CommandResult written =
        test::run_rlfusion(writer + "--checkpoint-every 2 --run-dir " + written_dir, writer_ranks);
    ASSERT_EQ(written.exit_code, 0) << written.output;
    const CommandResult straight =
        test::run_rlfusion(reader + "--run-dir " + straight_dir, reader_ranks);
    ASSERT_EQ(straight.exit_code, 0) << straight.output;
    const CommandResult resumed = test::run_rlfusion(
        reader + "--resume " + checkpoint_path(written_dir, 4) + " --run-dir " + resumed_dir,
        reader_ranks);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("resuming from checkpoint " + checkpoint_path(written_dir, 4)),
              std::string::npos)
        << resumed.output;
    EXPECT_EQ(test::json_number(resumed.output, "heldout_accuracy_before_rl"),
              test::json_number(straight.output, "heldout_accuracy_before_rl"));
    const std::vector<float> want = test::read_saved_parameters(straight_dir + "/model.h5");
    const std::vector<float> got = test::read_saved_parameters(resumed_dir + "/model.h5");
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LT(test::nmse(got.data(), want.data(), want.size()), 1e-6);
  }
}

TEST(Checkpoint, PipelineAndDataParallelCheckpointsResumeInEachOther) {
  expect_resumes_in_data_parallel_and_back("cross-pp", "--pipeline-parallel 2 ", 2, 2);
}

// TP 2 x EP 2 x PP 2 on 8 ranks (the KL term on): the first EP replica's TP x PP groups assemble
// the whole tensors of their stages (TP slices, then the pipeline), and TP rank 0's first stages
// write the experts' rows together; every rank reads back its slice of its stage with its
// experts, and a resumed run ends bit for bit where the uninterrupted one does. The file resumes
// in data parallelism and the other way round.
TEST(Checkpoint, FusedTensorExpertPipelineResumeIsBitExact) {
  const std::string layout = "--tensor-parallel 2 --pipeline-parallel 2 --expert-parallel 2 ";
  // 8 prompts (a block for each of the 8 generating ranks) after 100 SFT steps: with kRun's 30 the
  // rewards are all zero, AdamW scales gradients of rounding size to full steps, and no two layouts
  // end within float rounding of each other (the data-parallel run and PP x EP neither).
  const std::string run = test::kModelParallelRun + "--kl-coef 0.01 ";
  expect_kill_and_resume_bit_exact("tensor-expert-pipeline", 8, run + "--mode fused " + layout,
                                   "data");
  expect_resumes_in_data_parallel_and_back("cross-tp-ep-pp", layout, 8, 2, "", run);
}

// Stage balancing (the 4-layer `tiny`, PP 2 cut 3 + 1 layers, the KL term on): the first pipeline
// gathers its uneven stages into the whole-model file and a killed run resumes bit for bit; the
// file of an even cut (2 + 2) resumes in the uneven one and the other way round, each stage
// reading its layers by name (within float rounding of the resuming cut's straight run).
TEST(Checkpoint, UnevenPipelineStagesResumeBitExactAndAcrossCuts) {
  const std::string run = train_args(6, test::write_tiny4_model(temp_dir("tiny4")));
  const std::string uneven = "--pipeline-parallel 2 --pipeline-balance 3,1 ";
  expect_kill_and_resume_bit_exact("pipeline-uneven", 2, run + "--mode fused " + uneven, "data");
  expect_resumes_in_data_parallel_and_back("cross-cut", uneven, 2, 2, "--pipeline-parallel 2 ",
                                           run);
}

// PP x EP: every rank writes and reads its stage's layers with its experts' rows: PP 2 x EP 2 <->
// DP on 4 ranks, and <-> EP 2 (no pipelines) on 4 ranks.
TEST(Checkpoint, PipelineExpertParallelCheckpointsResumeInOtherLayouts) {
  const std::string layout = "--pipeline-parallel 2 --expert-parallel 2 ";
  expect_resumes_in_data_parallel_and_back("cross-pp-ep", layout, 4, 4);
  expect_resumes_in_data_parallel_and_back("cross-pp-ep-ep", layout, 4, 4, "--expert-parallel 2 ");
}

// Each TP rank writes and reads its slices of the whole tensors: TP 2 on 2 ranks (one replica)
// <-> one rank, and TP 2 x PP 2 <-> DP on 4 ranks (every rank generates its block in both). (TP 2
// against DP 2 would compare other runs: with the KL term their sampled tokens part under float
// rounding within the 6 steps.)
TEST(Checkpoint, TensorParallelAndDataParallelCheckpointsResumeInEachOther) {
  expect_resumes_in_data_parallel_and_back("cross-tp", "--tensor-parallel 2 ", 2, 1);
  expect_resumes_in_data_parallel_and_back("cross-tp-pp",
                                           "--tensor-parallel 2 --pipeline-parallel 2 ", 4, 4);
}

// TP x EP (TP 2 x EP 2 on 4 ranks, KL on): the first EP replica's TP groups assemble their slices
// and TP rank 0's EP group writes the experts' rows by id; a run killed while writing checkpoint 4
// resumes from checkpoint 2 bit for bit, and the file resumes in EP 2 on 2 ranks (the same two
// generating groups) and the other way round (without the KL term, whose float rounding would
// part the two layouts' sampled tokens within the 6 steps).
TEST(Checkpoint, TensorExpertParallelResumesBitExactAndInAnExpertParallelRun) {
  const std::string tensor_expert = "--tensor-parallel 2 --expert-parallel 2 ";
  expect_kill_and_resume_bit_exact("tensor-expert", 4, kRun + "--mode fused " + tensor_expert,
                                   "data");
  std::string without_kl = kRun;
  without_kl.erase(without_kl.find("--kl-coef 0.01 "), std::string("--kl-coef 0.01 ").size());
  expect_resumes_in_data_parallel_and_back("cross-tp-ep", tensor_expert, 4, 2,
                                           "--expert-parallel 2 ", without_kl);
}

// Disaggregated TP learners (1 actor + TP 2 learners on 3 ranks, KL on): TP group 0 gathers the
// whole-model file as the fused TP run does, and a killed run resumes bit for bit, synchronous
// and with StaleSync (the actor's queued batch in the file; also with 2 actors in a TP group at
// s = 1 and 2 on 4 ranks); the file resumes in the
// data-parallel disaggregated run on the same roles and the other way round (on the longer
// warmed-up run of the TP app tests: after 30 SFT steps float rounding parts the two layouts'
// sampled tokens within the 6 steps).
TEST(Checkpoint, DisaggregatedTensorParallelResumesBitExactAndInTheDataParallelRun) {
  const std::string roles = "--actors 1 --learners 2 ";
  const std::string tensor = kRun + roles + "--tensor-parallel 2 ";
  expect_kill_and_resume_bit_exact("disaggregated-tp", 3, tensor, "data");
  expect_kill_and_resume_bit_exact("disaggregated-tp-stale", 3, tensor + "--staleness 1 ", "data");
  // The 2 actors in a TP group: each saves the batch it generated ahead (the group's first rank
  // puts it) and restores its own; s = 2 with the posted weight sync.
  const std::string actor_tp =
      kRun + "--actors 2 --learners 2 --tensor-parallel 2 --actor-tensor-parallel 2 ";
  expect_kill_and_resume_bit_exact("disaggregated-actor-tp-stale", 4, actor_tp + "--staleness 1 ",
                                   "data");
  expect_kill_and_resume_bit_exact("disaggregated-actor-tp-deep", 4, actor_tp + "--staleness 2 ",
                                   "data");
  expect_resumes_in_data_parallel_and_back("cross-disaggregated-tp", roles + "--tensor-parallel 2 ",
                                           3, 3, roles, test::kModelParallelRun, "disaggregated");
  // TP 2 x EP 2 learners with 2 actors at EP 2: TP rank 0's EP group writes the experts by id;
  // with an actor TP 2 x EP 2 group pair at s = 1 too (each actor restores the batch it generated
  // ahead).
  expect_kill_and_resume_bit_exact(
      "disaggregated-tp-ep", 6,
      kRun + "--actors 2 --learners 4 --tensor-parallel 2 --expert-parallel 2 ", "data");
  // Actor TP groups without learner TP at s = 1.
  expect_kill_and_resume_bit_exact(
      "disaggregated-actor-tp-only-stale", 4,
      kRun + "--actors 2 --learners 2 --actor-tensor-parallel 2 --staleness 1 ", "data");
  expect_kill_and_resume_bit_exact("disaggregated-actor-tp-ep-stale", 8,
                                   kRun +
                                       "--actors 4 --learners 4 --tensor-parallel 2 "
                                       "--expert-parallel 2 --actor-tensor-parallel 2 "
                                       "--actor-expert-parallel 2 --staleness 1 ",
                                   "data");
}

// A checkpoint holds the whole model, so it loads at another expert-parallel degree.
TEST(Checkpoint, WrittenWithExpertParallelismResumesWithout) {
  const std::string dir = temp_dir("reshard");
  const CommandResult written = test::run_rlfusion(
      kRun + "--learners 2 --actors 2 --expert-parallel 2 --checkpoint-every 2 --run-dir " + dir,
      4);
  ASSERT_EQ(written.exit_code, 0) << written.output;
  const CommandResult resumed = test::run_rlfusion(
      kRun + "--resume " + checkpoint_path(dir, 4) + " --run-dir " + dir + "/b", 2);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from checkpoint"), std::string::npos);
}

// Flips one byte in the middle of `path`.
void damage(const std::string& path) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(std::streamoff(fs::file_size(path) / 2));
  char byte = 0;
  file.read(&byte, 1);
  file.seekp(std::streamoff(fs::file_size(path) / 2));
  byte = char(byte ^ 0x5a);
  file.write(&byte, 1);
}

TEST(Checkpoint, DamagedTruncatedAndWrongShapeFilesAreRefused) {
  const std::string dir = temp_dir("damaged");
  ASSERT_EQ(test::run_rlfusion(kRun + "--checkpoint-every 1 --run-dir " + dir).exit_code, 0);
  fs::remove(dir + "/summary.json");
  // Two checkpoints stay; none after the last step (model.h5 is the run's end).
  const std::string newest = checkpoint_path(dir, 5), previous = checkpoint_path(dir, 4);
  EXPECT_TRUE(fs::exists(newest));
  EXPECT_FALSE(fs::exists(checkpoint_path(dir, 3)));
  EXPECT_FALSE(fs::exists(checkpoint_path(dir, 6)));
  // Another model shape: refused by name before any work.
  const std::string other_model = dir + "/other.ini";
  std::ofstream(other_model) << "[model]\nname = tiny\nvocab_size = 32\nd_model = 32\n"
                                "n_layers = 2\nn_heads = 4\nn_experts = 4\ntop_k = 2\nd_ff = 16\n"
                                "shared_expert_d_ff = 16\nmax_seq_len = 128\n";
  CommandResult r = test::run_rlfusion(train_args(6, other_model) + "--resume " + previous +
                                       " --run-dir " + dir + "/other");
  EXPECT_EQ(r.exit_code, kExitConfigError) << r.output;
  EXPECT_NE(r.output.find("was written for model"), std::string::npos) << r.output;
  // One flipped byte.
  damage(newest);
  r = test::run_rlfusion(kRun + "--resume " + newest + " --run-dir " + dir);
  EXPECT_EQ(r.exit_code, kExitConfigError) << r.output;
  EXPECT_NE(r.output.find("does not match its CRC-32C"), std::string::npos) << r.output;
  // Truncated.
  fs::resize_file(previous, fs::file_size(previous) - 100);
  r = test::run_rlfusion(kRun + "--resume " + previous + " --run-dir " + dir);
  EXPECT_EQ(r.exit_code, kExitConfigError) << r.output;
  EXPECT_NE(r.output.find("truncated"), std::string::npos) << r.output;
  // auto passes over both, says why, and starts from scratch.
  r = test::run_rlfusion(kRun + "--resume auto --run-dir " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--resume auto skips"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("starting from scratch"), std::string::npos) << r.output;
}

// Disaggregated StaleSync: the actors run one batch ahead, so the checkpoint of step k holds
// batch k + 1 (put into DistQueue, not yet taken), which the actors put again on resume.
TEST(Checkpoint, DisaggregatedStaleSyncResumeWithTheQueuedBatchIsBitExact) {
  const std::string extra = "--staleness 1 --ranks-per-node 1 ";
  expect_kill_and_resume_bit_exact("disaggregated-stale", 2, kRun + extra, "data");
  // Checkpoint 2 holds the actor's batch 3 (4 prompts x 4 samples, generated with version 1,
  // finished); the learner has nothing in flight.
  const std::string path = checkpoint_path(temp_dir_name("disaggregated-stale-killed"), 2);
  EXPECT_TRUE(read_in_flight(path, 0).empty());
  const std::vector<InFlightSample> queued = read_in_flight(path, 1);
  ASSERT_EQ(queued.size(), 16u);
  for (const InFlightSample& s : queued) {
    EXPECT_TRUE(s.finished);
    EXPECT_EQ(s.version_min, 1);
    EXPECT_EQ(s.version_max, 1);
    EXPECT_GE(s.prompt_id, 8);  // batch 3: prompts 8..11
    EXPECT_LT(s.prompt_id, 12);
    EXPECT_FALSE(s.response.empty());
  }
  // A layout with another count of ranks that generate or train: refused before any work.
  const CommandResult other = test::run_rlfusion(
      kRun + extra + "--actors 2 --resume " + path + " --run-dir " + temp_dir("stale-other"), 3);
  EXPECT_EQ(other.exit_code, kExitConfigError) << other.output;
  EXPECT_NE(other.output.find("resume with the layout it was written with"), std::string::npos)
      << other.output;
}

// With bound s the actors run s batches ahead: the checkpoint of step k holds batches k + 1 ..
// k + s (batch b generated with version max(0, b - 1 - s)), which the actors put again on resume,
// each at its step.
void expect_checkpoint_holds_batches(const std::string& name, int staleness, int first_batch,
                                     int batches) {
  const std::string path = checkpoint_path(temp_dir_name(name + "-killed"), 2);
  EXPECT_TRUE(read_in_flight(path, 0).empty());
  const std::vector<InFlightSample> queued = read_in_flight(path, 1);
  ASSERT_EQ(queued.size(), size_t(batches) * 16u);  // 4 prompts x 4 samples per batch
  for (const InFlightSample& s : queued) {
    const int batch = int(s.prompt_id / 4) + 1;
    EXPECT_TRUE(s.finished);
    EXPECT_GE(batch, first_batch);
    EXPECT_LT(batch, first_batch + batches);
    EXPECT_EQ(s.version_min, std::max(0, batch - 1 - staleness)) << "prompt " << s.prompt_id;
    EXPECT_EQ(s.version_max, s.version_min);
  }
}

TEST(Checkpoint, DisaggregatedDeeperStaleSyncResumeWithEveryQueuedBatchIsBitExact) {
  expect_kill_and_resume_bit_exact("disaggregated-stale-2", 2,
                                   kRun + "--staleness 2 --ranks-per-node 1 ", "data");
  expect_checkpoint_holds_batches("disaggregated-stale-2", 2, 3, 2);
  // A dedicated queue rank (not in the gather of the samples in flight).
  expect_kill_and_resume_bit_exact("disaggregated-stale-3", 3,
                                   kRun + "--staleness 3 --learners 1 --actors 1 --queue-ranks 1 ",
                                   "data");
  expect_checkpoint_holds_batches("disaggregated-stale-3", 3, 3, 3);
  // Sharded experts on learners and actors: the learners of replica 0 post their experts.
  expect_kill_and_resume_bit_exact("disaggregated-stale-2-ep", 4,
                                   kRun +
                                       "--staleness 2 --learners 2 --actors 2 "
                                       "--expert-parallel 2 --actor-expert-parallel 2 ",
                                   "data");
}

// Starts the run in the background, sends `signal` to `target` (the rank, or mpiexec, which
// forwards SIGUSR1 to every rank) once step 2's progress line is in the log, and expects a
// checkpoint and exit code 3; --resume auto then finishes it bit for bit like a straight run.
void expect_signal_checkpoints_and_stops(const std::string& name, int ranks,
                                         const std::string& extra, const std::string& signal) {
  const std::string straight_dir = temp_dir(name + "-straight");
  const std::string dir = temp_dir(name + "-signalled");
  // Long enough that the signal lands mid-run even when the poll below is slow (a loaded CI
  // machine): 20 steps of the tiny model can end before it is sent.
  const std::string run_args = train_args(500) + extra;
  const CommandResult straight = test::run_rlfusion(run_args + "--run-dir " + straight_dir, ranks);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::string launcher =
      ranks > 0 ? "mpiexec -n " + std::to_string(ranks) + " --oversubscribe " : std::string();
  const std::string script = dir + ".sh";
  std::ofstream(script) << "cd " RLFUSION_SOURCE_DIR "\n"
                        << "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\n"
                        << launcher << RLFUSION_BINARY " " << run_args << "--run-dir " << dir
                        << " > " << dir << ".out 2>&1 &\npid=$!\n"
                        << "until grep -qE '^ +2 ' " << dir
                        << "/log.txt 2>/dev/null; do sleep 0.05; done\n"
                        << "kill -" << signal << " $pid\nwait $pid\necho \"exit=$?\"\n"
                        << "cat " << dir << ".out\n";
  FILE* pipe = popen(("bash " + script).c_str(), "r");
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  pclose(pipe);
  ASSERT_NE(output.find("exit=3"), std::string::npos) << output;
  EXPECT_NE(output.find("stopped by SIGTERM or SIGUSR1 after RL step"), std::string::npos)
      << output;
  EXPECT_FALSE(fs::exists(dir + "/summary.json"));
  const CommandResult resumed =
      test::run_rlfusion(run_args + "--resume auto --run-dir " + dir, ranks);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  expect_same_run(straight, straight_dir, resumed, dir);
}

TEST(Checkpoint, OneRankSigtermCheckpointsAndStops) {
  expect_signal_checkpoints_and_stops("sigterm", 0, "", "TERM");
}

TEST(Checkpoint, TwoRanksSigusr1ThroughMpiexecCheckpointsAndStops) {
  expect_signal_checkpoints_and_stops("sigusr1", 2, "--ranks-per-node 1 ", "USR1");
}

// With sharded experts on learners and actors and a dedicated queue rank (not in the gather of
// the samples in flight).
TEST(Checkpoint, DisaggregatedStaleSyncExpertParallelWithQueueRankResumeIsBitExact) {
  expect_kill_and_resume_bit_exact("disaggregated-stale-ep", 5,
                                   kRun +
                                       "--staleness 1 --learners 2 --actors 2 --queue-ranks 1 "
                                       "--expert-parallel 2 --actor-expert-parallel 2 ",
                                   "data");
}

TEST(Checkpoint, DisaggregatedStaleSyncSigusr1CheckpointsAndStops) {
  expect_signal_checkpoints_and_stops("disaggregated-stale-sigusr1", 2,
                                      "--staleness 1 --ranks-per-node 1 ", "USR1");
}

// Actors two steps ahead: the signal's stop is agreed at a step end the actors reach after their
// put two batches later; the resumed run puts both batches again.
TEST(Checkpoint, DisaggregatedDeeperStaleSyncSigusr1CheckpointsAndStops) {
  expect_signal_checkpoints_and_stops("disaggregated-stale-2-sigusr1", 2,
                                      "--staleness 2 --ranks-per-node 1 ", "USR1");
}

// Data reordering with counted costs is a pure function of each step's samples: a resumed run
// makes the same plans and ends bit for bit where the uninterrupted one does.
TEST(Checkpoint, ReorderedLearnersAndFusedRanksResumeIsBitExact) {
  expect_kill_and_resume_bit_exact("reorder-disaggregated", 3,
                                   kRun + "--learners 2 --actors 1 --reorder-samples counted ",
                                   "data");
  expect_kill_and_resume_bit_exact("reorder-fused", 2,
                                   kRun + "--mode fused --reorder-samples counted ", "data");
}

TEST(Checkpoint, FusedStaleSyncSigusr1CheckpointsAndStops) {
  expect_signal_checkpoints_and_stops("stale-sigusr1", 2, "--mode fused --staleness 1 ", "USR1");
}

}  // namespace
}  // namespace rlf
