// Fused StaleSync (`--staleness`) with model parallelism. TP: every rank of a TP group holds the
// same rollout pool and makes the same decisions (generation is collective over the group), so
// its ranks train the same samples; the TP replicas train different numbers of finished groups
// per step. PP (and TP x PP): generation is data-parallel, every rank its own pool; a pipeline
// gathers its ranks' finished groups and trains them together, each rank's block in --micro-batch
// pieces. s = 0 is the synchronous run bit for bit; s = 1 keeps the bound (checked from the
// trace), trains every sample once (the ranks of a model replica the same ones), is reproducible
// whatever the timing, and trains the samples the data-parallel run with the same pools trains, to
// float rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "src/app/pipeline_parallel_train.h"
#include "src/io/trace_reader.h"
#include "tests/app/fused_train_runs.h"
#include "tests/app/progress_rows.h"
#include "tests/app/read_parameters.h"
#include "tests/app/run_rlfusion.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

using Result = test::CommandResult;

// Per sample id, the version it was trained at; each rank of a model replica (`degree` consecutive
// ranks: a TP group, a pipeline) must have trained the same samples in the same order, within the
// bound, and each sample is trained by one replica only.
std::map<int64_t, int> trained_by_model_replicas(const std::string& dir, int degree, int staleness,
                                                 int* stale_samples) {
  const TraceData trace = read_trace(dir + "/trace.h5");
  std::map<int64_t, int> trained;
  *stale_samples = 0;
  for (size_t rank = 0; rank < trace.samples.size(); ++rank) {
    const std::vector<TrainedSample>& samples = trace.samples[rank];
    const size_t leader = rank - rank % size_t(degree);
    if (rank != leader) {
      const std::vector<TrainedSample>& want = trace.samples[leader];
      EXPECT_EQ(samples.size(), want.size()) << "rank " << rank;
      for (size_t i = 0; i < std::min(samples.size(), want.size()); ++i) {
        EXPECT_EQ(samples[i].sample_id, want[i].sample_id) << "rank " << rank;
        EXPECT_EQ(samples[i].version_min, want[i].version_min) << "rank " << rank;
        EXPECT_EQ(samples[i].trained_version, want[i].trained_version) << "rank " << rank;
      }
      continue;
    }
    for (const TrainedSample& s : samples) {
      EXPECT_GE(s.staleness(), 0) << "sample " << s.sample_id;
      EXPECT_LE(s.staleness(), staleness) << "sample " << s.sample_id;
      EXPECT_TRUE(trained.emplace(s.sample_id, s.trained_version).second)
          << "sample " << s.sample_id << " trained twice";
      *stale_samples += s.staleness() > 0;
    }
  }
  return trained;
}

// The policy every run of a test starts from: `model` after 150 SFT steps on sort-heavytail, run
// once per model and test process (`rlfusion sft`) instead of once per run, each run loading it
// with --init. Returns the options that start a train run from it.
std::string warm_started(const std::string& model) {
  static std::map<std::string, std::string> sft_models;
  auto [at, added] = sft_models.emplace(model, "");
  if (added) {
    const std::string dir = test::fresh_temp_dir("mp-stale-sft");
    const Result sft = test::run_rlfusion(
        "sft --model " + model +
        " --task sort-heavytail --steps 150 --learning-rate 0.01 --eval-prompts 0 --run-dir " +
        dir);
    EXPECT_EQ(sft.exit_code, 0) << sft.output;
    at->second = dir + "/model.h5";
  }
  return "train --model " + model + " --init " + at->second +
         " --task sort-heavytail --sft-steps 0 ";
}

// The run directory of `run` on `ranks` ranks, run once per test process: several layouts compare
// with the same data-parallel run (the same options, model and rank count). Empty when it failed.
std::string data_parallel_run(const std::string& run, int ranks) {
  static std::map<std::pair<std::string, int>, std::string> run_dirs;
  auto [at, added] = run_dirs.emplace(std::make_pair(run, ranks), "");
  if (added) {
    // A name of its own: a later run must not clear it.
    const std::string dir = test::fresh_temp_dir("mp-stale-dp-" + std::to_string(run_dirs.size()));
    const Result dp = test::run_rlfusion(run + "--run-dir " + dir, ranks);
    EXPECT_EQ(dp.exit_code, 0) << dp.output;
    if (dp.exit_code == 0) at->second = dir;
  }
  return at->second;
}

// The run in `dir` (model replicas of `replica_ranks` ranks, s = 1, 8 steps of 8 x 4 samples)
// trained the samples of the data-parallel run in `dp_dir` at its versions (most of them, some
// resumed across a cut) and its weights within 1e-8.
void expect_trains_the_data_parallel_run(const std::string& dir, const std::string& dp_dir,
                                         int replica_ranks) {
  int stale = 0, dp_stale = 0;
  const std::map<int64_t, int> trained = trained_by_model_replicas(dir, replica_ranks, 1, &stale);
  EXPECT_GT(int(trained.size()), 8 * 8 * 4 * 3 / 4);
  EXPECT_GT(stale, 0) << "no sample was resumed across a cut";
  EXPECT_EQ(trained_by_model_replicas(dp_dir, 1, 1, &dp_stale), trained);
  EXPECT_EQ(dp_stale, stale);
  const std::vector<float> model = test::read_saved_parameters(dir + "/model.h5");
  const std::vector<float> dp_model = test::read_saved_parameters(dp_dir + "/model.h5");
  ASSERT_EQ(model.size(), dp_model.size());
  EXPECT_LT(test::nmse(model.data(), dp_model.data(), dp_model.size()), 1e-8);
}

TEST(ModelParallelStaleSync, ZeroStalenessIsTheSynchronousRunBitForBit) {
  for (const std::string layout : {"--tensor-parallel 2 ", "--pipeline-parallel 2 "}) {
    SCOPED_TRACE(layout);
    const std::string run = test::kModelParallelFusedRun + layout;
    const std::string sync_dir = test::fresh_temp_dir("mp-stale-sync");
    const std::string zero_dir = test::fresh_temp_dir("mp-stale-zero");
    const Result sync = test::run_rlfusion(run + "--run-dir " + sync_dir, 2);
    const Result zero =
        test::run_rlfusion(run + "--staleness 0 --random-delay-ms 4 --run-dir " + zero_dir, 2);
    ASSERT_EQ(sync.exit_code, 0) << sync.output;
    ASSERT_EQ(zero.exit_code, 0) << zero.output;
    EXPECT_EQ(test::progress_rows(zero.output), test::progress_rows(sync.output));
    EXPECT_EQ(test::read_saved_parameters(zero_dir + "/model.h5"),
              test::read_saved_parameters(sync_dir + "/model.h5"));
  }
}

// `tiny` without the router's load-balancing loss (aux_loss_coef = 0) written into `model_dir`;
// returns the model file's path. That loss is taken per micro-batch, so layouts that cut a rank's
// samples into other pieces than the data-parallel run's train the same samples to other weights
// with it.
std::string write_tiny_no_aux_model(const std::string& model_dir) {
  std::filesystem::create_directories(model_dir);
  const std::string path = model_dir + "/tiny-no-aux.ini";
  std::ofstream out(path);
  out << "[model]\nname = tiny-no-aux\nvocab_size = 32\nd_model = 32\nn_layers = 2\n"
         "n_heads = 4\nn_experts = 4\ntop_k = 2\nd_ff = 32\nshared_expert_d_ff = 16\n"
         "max_seq_len = 128\naux_loss_coef = 0\n";
  return path;
}

// A model-parallel layout of a StaleSync test: the layout's options, how many consecutive ranks
// train the same samples (a model replica), and the data-parallel run whose pools make the same
// decisions.
struct StaleLayout {
  std::string options;
  int replica_ranks, data_parallel_ranks;
  std::string data_parallel_options;  // the run to compare with: its expert parallelism
  bool four_layers = false;           // the 4-layer tiny (virtual stages)
  // When set, the weights are compared with this run's on 4 ranks instead of the
  // data-parallel run's.
  std::string same_weights_as = {};
  int ranks = 4;  // of the model-parallel runs
  int group_size = 4;
  std::string model = {};  // a model file instead of tiny (or tiny4)
};

// The heavy-tailed task after a warm start (`tiny4`: the 4-layer tiny's model file), s = 1, 8
// steps of 8 prompts: the layout keeps the bound, trains every sample once (its replica's ranks
// the same ones), reproducibly whatever the timing, and trains the data-parallel run's samples at
// its versions, to its weights within float rounding.
void expect_keeps_the_bound_like_the_data_parallel_run(const StaleLayout& layout,
                                                       const std::string& tiny4) {
  const std::string heavy_tailed =
      "--steps 8 --prompts 8 --group-size " + std::to_string(layout.group_size) +
      " --eval-prompts 16 --log-every 4 --mode fused --staleness 1 --kl-coef 0.01 ";
  const std::string model_file = !layout.model.empty() ? layout.model
                                 : layout.four_layers  ? tiny4
                                                       : "tiny";
  const std::string run = warm_started(model_file) + heavy_tailed;
  const std::string a_dir = test::fresh_temp_dir("mp-stale-a");
  const std::string b_dir = test::fresh_temp_dir("mp-stale-b");
  const Result a = test::run_rlfusion(
      run + layout.options + "--random-delay-ms 2 --run-dir " + a_dir, layout.ranks);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const Result b = test::run_rlfusion(run + layout.options + "--run-dir " + b_dir, layout.ranks);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::string dp_dir =
      data_parallel_run(run + layout.data_parallel_options, layout.data_parallel_ranks);
  ASSERT_FALSE(dp_dir.empty());
  EXPECT_NE(a.output.find("StaleSync pool of rank 0"), std::string::npos) << a.output;
  if (layout.options.find("--pipeline-parallel 2 --expert-parallel") != std::string::npos ||
      layout.options.find("--virtual-stages 2 --expert-parallel") != std::string::npos) {
    // (PP x EP, also inside TP x EP x PP)
    // The pipelines' piece counts differed at some step: empty micro-batches kept the EP
    // mates in step.
    const std::string padded = "# StaleSync at PP x EP: the ranks ran ";
    const size_t at = a.output.find(padded);
    ASSERT_NE(at, std::string::npos) << a.output;
    EXPECT_GT(std::stoi(a.output.substr(at + padded.size())), 0) << a.output;
  }
  // The same seed, other timing: the same weights bit for bit.
  EXPECT_EQ(test::read_saved_parameters(a_dir + "/model.h5"),
            test::read_saved_parameters(b_dir + "/model.h5"));

  int stale = 0, dp_stale = 0;
  const std::map<int64_t, int> trained =
      trained_by_model_replicas(a_dir, layout.replica_ranks, 1, &stale);
  const int total = 8 * 8 * layout.group_size;
  // What the last phases left unfinished is not trained; everything else is, some resumed.
  EXPECT_GT(int(trained.size()), total * 3 / 4);
  EXPECT_LE(int(trained.size()), total);
  EXPECT_GT(stale, 0) << "no sample was resumed across a cut";
  // The data-parallel run's pools made the same decisions: the same samples at the same
  // versions, and the same weights up to the float rounding of the model-parallel sums.
  EXPECT_EQ(trained_by_model_replicas(dp_dir, 1, 1, &dp_stale), trained);
  EXPECT_EQ(dp_stale, stale);
  const std::vector<float> model = test::read_saved_parameters(a_dir + "/model.h5");
  std::string weights_dir = dp_dir;
  if (!layout.same_weights_as.empty()) {
    weights_dir = test::fresh_temp_dir("mp-stale-weights");
    const Result same =
        test::run_rlfusion(run + layout.same_weights_as + "--run-dir " + weights_dir, 4);
    ASSERT_EQ(same.exit_code, 0) << same.output;
  }
  const std::vector<float> reference_model = test::read_saved_parameters(weights_dir + "/model.h5");
  ASSERT_EQ(model.size(), reference_model.size());
  EXPECT_LT(test::nmse(model.data(), reference_model.data(), reference_model.size()), 1e-6);
}

// The heavy-tailed task after a warm start: phases are cut and samples resume across them. On 4
// ranks: TP 2 x DP 2 (each replica's pool is the pool of one rank of the data-parallel run on 2
// ranks), TP 2 x EP 2 (likewise, against EP 2 on 2 ranks: the TP groups generate together over
// the EP group), PP 2 x DP 2, interleaved PP 2 x DP 2 with 2 virtual stages (a 4-layer tiny: each
// pipeline's pieces of 3 split into an even count) and TP 2 x PP 2 (every rank's pool is one rank's
// of the data-parallel run on 4 ranks: the same prompts, slots and sampling keys). TP 2 x DP 2
// generating data-parallel (--actor-tensor-parallel 1) keeps a pool per rank, as the
// data-parallel run on 4 ranks does, and each TP group trains its two ranks' samples. PP 2 x EP 2
// (1F1B, and interleaved on the 4-layer tiny) likewise, each pipeline padding its micro-batches
// with empty ones to its EP mate's count; and TP 2 x EP 2 x PP 2 on 8 ranks against the
// data-parallel run on 8.
TEST(ModelParallelStaleSync, KeepsTheBoundReproduciblyAndTrainsTheDataParallelRunsSamples) {
  using Layout = StaleLayout;
  const std::string tiny4 = test::write_tiny4_model(test::fresh_temp_dir("mp-stale-model"));
  for (const Layout& layout :
       {Layout{"--tensor-parallel 2 ", 2, 2, ""}, Layout{"--pipeline-parallel 2 ", 2, 4, ""},
        Layout{"--tensor-parallel 2 --pipeline-parallel 2 ", 4, 4, ""},
        Layout{"--tensor-parallel 2 --expert-parallel 2 ", 2, 2, "--expert-parallel 2 "},
        // TP 2 x DP 2 generating data-parallel: every rank's pool is one rank's of the
        // data-parallel run on 4 ranks, and each TP group trains both of its ranks' samples. Its
        // weights are compared with TP 2 x DP 2 generating at TP 2 (the same TP sums; measured
        // 1.3e-11): the data-parallel run on 4 ranks sums its gradients in another order, and by
        // step 6 that rounding flips a sampled token (its weights 1.5e-6 away, as are those of the
        // TP 2 default run).
        Layout{"--tensor-parallel 2 --actor-tensor-parallel 1 ", 2, 4, "", false,
               "--tensor-parallel 2 "},
        Layout{"--pipeline-parallel 2 --virtual-stages 2 --micro-batch 3 ", 2, 4,
               "--micro-batch 3 ", true},
        // PP 2 x EP 2: each pipeline's pieces of one group (--micro-batch 4), padded with empty
        // micro-batches to its EP mate's count (1F1B and interleaved).
        Layout{"--pipeline-parallel 2 --expert-parallel 2 --micro-batch 4 ", 2, 4,
               "--micro-batch 4 "},
        Layout{"--pipeline-parallel 2 --virtual-stages 2 --expert-parallel 2 --micro-batch 3 ", 2,
               4, "--micro-batch 3 ", true},
        // TP 2 x EP 2 x PP 2 on 8 ranks: every rank's pool is one rank's of the data-parallel run
        // on 8, each model replica (4 ranks) training its ranks' samples.
        Layout{"--tensor-parallel 2 --pipeline-parallel 2 --expert-parallel 2 --micro-batch 4 ", 4,
               8, "--micro-batch 4 ", false, "", 8}}) {
    SCOPED_TRACE(layout.options);
    expect_keeps_the_bound_like_the_data_parallel_run(layout, tiny4);
  }
}

// Generation inside the pipelines with StaleSync (--actor-pipeline-parallel 2): every rank's pool
// is a lane of its pipeline, the stages computing its logits from their own layers, so it makes the
// decisions of one rank's pool of the data-parallel run: PP 2 x DP 2 (1F1B), interleaved with 2
// virtual stages on the 4-layer tiny and PP 2 x EP 2 (a stage's passes pairing with its EP mate's)
// against the data-parallel run on 4 ranks. With TP inside the stages generation runs at the
// training TP degree, a TP group's ranks holding alike pools, as TP x PP generating at TP 2
// borrowing does (GenerationAtATensorParallelDegreeOfItsOwn... below: groups of 3, tiny without
// the router loss): TP 2 x PP 2 against the data-parallel run on 2 ranks, and TP 2 x PP 2 x EP 2
// on 8 ranks against it on 4. The random delays change when each lane's steps come, and the
// weights stay bit for bit.
TEST(ModelParallelStaleSync, GeneratesInsideThePipelinesLikeTheDataParallelRun) {
  using Layout = StaleLayout;
  const std::string model_dir = test::fresh_temp_dir("mp-stale-inside-model");
  const std::string tiny4 = test::write_tiny4_model(model_dir);
  for (const Layout& layout :
       {Layout{"--pipeline-parallel 2 --actor-pipeline-parallel 2 ", 2, 4, ""},
        Layout{"--pipeline-parallel 2 --virtual-stages 2 --actor-pipeline-parallel 2 "
               "--micro-batch 3 ",
               2, 4, "--micro-batch 3 ", true},
        Layout{"--pipeline-parallel 2 --expert-parallel 2 --micro-batch 4 "
               "--actor-pipeline-parallel 2 ",
               2, 4, "--micro-batch 4 "}}) {
    SCOPED_TRACE(layout.options);
    expect_keeps_the_bound_like_the_data_parallel_run(layout, tiny4);
  }
  const std::string no_aux = write_tiny_no_aux_model(model_dir);
  for (Layout layout :
       {Layout{"--tensor-parallel 2 --pipeline-parallel 2 --actor-pipeline-parallel 2 ", 4, 2, ""},
        Layout{"--tensor-parallel 2 --pipeline-parallel 2 --expert-parallel 2 "
               "--actor-pipeline-parallel 2 ",
               4, 4, "", false, "", 8}}) {
    SCOPED_TRACE(layout.options);
    layout.group_size = 3;
    layout.model = no_aux;
    expect_keeps_the_bound_like_the_data_parallel_run(layout, "");
  }
}

// Training at TP 1 generating at TP G with StaleSync: a generation TP group holds one pool (one
// rank's of the data-parallel run on half the ranks) and its ranks take whole finished groups,
// consecutive, in TP-rank order, unequal when the count does not split (odd counts of groups of
// 3 here). Data-parallel training generating at TP 2 (each rank then trains its own share), PP 2
// x DP 2 generating at TP 2 (each pipeline, which is a generation group, trains its two ranks'
// shares), EP 2 training generating at TP 2 (groups {0, 2} and {1, 3}, the ranks holding one
// expert block, over the training EP groups), and TP 2 x PP 2 generating at TP 2, whose share once
// required an even split of the samples (a group of 3 cut between two ranks, or a stop when the
// samples were odd): the same samples at the same versions as the data-parallel run on 2 ranks, and
// its weights within float rounding. (The router's load-balancing loss is per micro-batch, and a
// share is a micro-batch of its own where the data-parallel rank trains its whole pool in one:
// these runs train tiny without it; with it they are 1.5e-5 apart after 8 steps.)
TEST(ModelParallelStaleSync, GenerationAtATensorParallelDegreeOfItsOwnSharesWholeFinishedGroups) {
  const std::string model_dir = test::fresh_temp_dir("mp-stale-share-model");
  const std::string no_aux = write_tiny_no_aux_model(model_dir);
  for (const std::string options :
       {"--actor-tensor-parallel 2 ", "--pipeline-parallel 2 --actor-tensor-parallel 2 ",
        "--tensor-parallel 2 --pipeline-parallel 2 "
        "--actor-tensor-parallel 2 ",
        "--expert-parallel 2 --actor-tensor-parallel 2 "}) {
    SCOPED_TRACE(options);
    StaleLayout layout{options, /*replica_ranks=*/1, /*data_parallel_ranks=*/2, ""};
    layout.replica_ranks = options.find("--tensor-parallel") != std::string::npos     ? 4
                           : options.find("--pipeline-parallel") != std::string::npos ? 2
                                                                                      : 1;
    layout.group_size = 3;
    layout.model = no_aux;
    expect_keeps_the_bound_like_the_data_parallel_run(layout, "");
  }
}

// Several minibatches and a fixed micro-batch count under PP StaleSync. Each minibatch takes its
// share of every rank's block, as each rank of the data-parallel run takes it of its own samples,
// and the decoupled objective's anchor for the later minibatches comes from a whole copy of the
// policy gathered from the stages, on each rank's own samples (as the data-parallel rank computes
// it), so the runs train the data-parallel run's samples at its versions, to its weights within
// float rounding (measured 6e-14 to 6e-10; without the gathered anchor PP 2 x DP 2 is 6e-6 off).
// --micro-batches M cuts a pipeline's samples into M equal parts, empty where it holds fewer than
// M (whole groups of 4 into 8 parts); their router loss differs from the data-parallel run's
// per-piece one, so those layouts train a model without it (aux_loss_coef = 0).
TEST(ModelParallelStaleSync, SeveralMinibatchesAndFixedMicroBatchCountsTrainTheDataParallelRuns) {
  const std::string model_dir = test::fresh_temp_dir("mp-stale-mb-model");
  const std::string tiny4 = test::write_tiny4_model(model_dir);
  const std::string no_aux = write_tiny_no_aux_model(model_dir);
  struct Layout {
    std::string model, options, data_parallel_options;
    int replica_ranks;
  };
  for (const Layout& layout :
       {Layout{"tiny", "--pipeline-parallel 2 --minibatches 2 ", "--minibatches 2 ", 2},
        Layout{"tiny", "--tensor-parallel 2 --pipeline-parallel 2 --minibatches 2 ",
               "--minibatches 2 ", 4},
        Layout{tiny4, "--pipeline-parallel 2 --virtual-stages 2 --micro-batch 3 --minibatches 2 ",
               "--micro-batch 3 --minibatches 2 ", 2},
        Layout{"tiny", "--pipeline-parallel 2 --expert-parallel 2 --micro-batch 4 --minibatches 2 ",
               "--micro-batch 4 --minibatches 2 ", 2},
        Layout{no_aux, "--pipeline-parallel 2 --micro-batches 8 ", "", 2},
        Layout{no_aux,
               "--pipeline-parallel 2 --expert-parallel 2 --micro-batches 8 --minibatches 2 ",
               "--minibatches 2 ", 2}}) {
    SCOPED_TRACE(layout.model + " " + layout.options);
    const std::string run = warm_started(layout.model) +
                            "--steps 8 --prompts 8 --group-size 4 --eval-prompts 16 --log-every 4 "
                            "--mode fused --staleness 1 --kl-coef 0.01 ";
    const std::string dir = test::fresh_temp_dir("mp-stale-mb");
    const Result mp =
        test::run_rlfusion(run + layout.options + "--random-delay-ms 2 --run-dir " + dir, 4);
    ASSERT_EQ(mp.exit_code, 0) << mp.output;
    const std::string dp_dir = data_parallel_run(run + layout.data_parallel_options, 4);
    ASSERT_FALSE(dp_dir.empty());
    expect_trains_the_data_parallel_run(dir, dp_dir, layout.replica_ranks);
  }
}

// StaleSync with PP x EP generating at an EP degree of its own (--actor-expert-parallel 1: every
// rank's pool generates with every expert, received through the layout switch after the
// pipeline's): the data-parallel run's samples at its versions and its weights within float
// rounding (measured 3e-14).
TEST(ModelParallelStaleSync,
     PipelineExpertParallelGeneratingAtItsOwnDegreeTrainsTheDataParallelRun) {
  const std::string run = warm_started("tiny") +
                          "--steps 8 --prompts 8 --group-size 4 --eval-prompts 16 --log-every 4 "
                          "--mode fused --staleness 1 --kl-coef 0.01 --micro-batch 4 ";
  const std::string dir = test::fresh_temp_dir("mp-stale-gen-ep");
  const std::string dp_dir = test::fresh_temp_dir("mp-stale-gen-ep-dp");
  const Result mp = test::run_rlfusion(run +
                                           "--pipeline-parallel 2 --expert-parallel 2 "
                                           "--actor-expert-parallel 1 --run-dir " +
                                           dir,
                                       4);
  ASSERT_EQ(mp.exit_code, 0) << mp.output;
  EXPECT_NE(mp.output.find("# layout switch: training EP 2, generation EP 1"), std::string::npos)
      << mp.output;
  const Result dp = test::run_rlfusion(run + "--run-dir " + dp_dir, 4);
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  expect_trains_the_data_parallel_run(dir, dp_dir, 2);
}

// StaleSync's pieces under the interleaved schedule: on random piece lists (pieces of 1-5 samples,
// with at least p samples in all and a multiple of p of them, as whole groups give), the split
// covers the same samples in order, holds a multiple of p pieces, never a larger piece than
// before, and changes nothing that was already a multiple.
TEST(ModelParallelStaleSync, InterleavedPiecesSplitIntoAMultipleOfTheStages) {
  std::mt19937 random(20261202);
  for (int trial = 0; trial < 500; ++trial) {
    const int stages = 2 + int(random() % 3);
    std::vector<std::pair<size_t, size_t>> bounds;
    size_t samples = 0;
    while (samples < size_t(stages) || samples % size_t(stages) != 0) {
      const size_t piece = 1 + random() % 5;
      bounds.emplace_back(samples, samples + piece);
      samples += piece;
    }
    const auto before = bounds;
    split_into_stage_multiple(bounds, stages);
    ASSERT_EQ(bounds.size() % size_t(stages), 0u);
    if (before.size() % size_t(stages) == 0) {
      EXPECT_EQ(bounds, before);
    }
    size_t next = 0, largest = 0, largest_before = 0;
    for (const auto& [begin, end] : before) largest_before = std::max(largest_before, end - begin);
    for (const auto& [begin, end] : bounds) {
      ASSERT_EQ(begin, next);
      ASSERT_LT(begin, end);
      largest = std::max(largest, end - begin);
      next = end;
    }
    EXPECT_EQ(next, samples);
    EXPECT_LE(largest, largest_before);
  }
  // By hand: 3 pieces at p = 2: the largest (the first of the 3s) splits, front half larger.
  std::vector<std::pair<size_t, size_t>> bounds = {{0, 2}, {2, 5}, {5, 8}};
  split_into_stage_multiple(bounds, 2);
  EXPECT_EQ(bounds, (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 4}, {4, 5}, {5, 8}}));
  // Single-sample pieces cannot be split.
  std::vector<std::pair<size_t, size_t>> ones = {{0, 1}, {1, 2}, {2, 3}};
  EXPECT_THROW(split_into_stage_multiple(ones, 2), std::logic_error);
}

}  // namespace
}  // namespace rlf
