// `train --mode fused --tensor-parallel`: TP 2 on 2 ranks, TP 2 x DP 2 and TP 2 x EP 2 on 4 ranks
// (with the token split and duplicated; and TP on attention only) train like the data-parallel
// fused run of the same prompts: the same held-out accuracy before and after RL, the same reward
// every step, and a saved whole model within float rounding of it; so do TP 2 x DP 2 generating
// data-parallel (--actor-tensor-parallel 1: each rank generates its block from the whole model
// gathered for the phase, counted, and its TP group trains both ranks' samples; with TP 2 x EP 2
// too, each rank keeping its training experts) and TP 4
// generating at TP 2 (slices regrouped for the phase); and data-parallel or pipeline training
// generating at a TP degree (each rank's slice cut locally or received from the other stages).
// Degrees and combinations that do not fit
// stop every rank with exit code 2 before any output.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/app/fused_train_runs.h"
#include "tests/app/json_output.h"
#include "tests/app/memory_peaks.h"
#include "tests/app/progress_rows.h"
#include "tests/app/read_parameters.h"
#include "tests/app/run_rlfusion.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

using Result = test::CommandResult;

std::string temp_dir(const std::string& name) {
  return test::fresh_temp_dir("tp-" + name);
}

const std::string& kFusedRun = test::kModelParallelFusedRun;
using test::step_rewards;

TEST(TensorParallelTrain, TrainsLikeTheDataParallelFusedRun) {
  const std::string dp_dir = temp_dir("dp");
  const Result dp = test::run_rlfusion(kFusedRun + "--run-dir " + dp_dir, 2);
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  const std::vector<float> dp_model = test::read_tiny_parameters(dp_dir + "/model.h5");
  const std::vector<std::string> dp_steps = step_rewards(dp.output);
  ASSERT_EQ(dp_steps.size(), 6u) << dp.output;
  struct Layout {
    int ranks;
    std::string options, log, expert_log;
    int tp = 2, generation_tp = 2;
    int overlap_chunks = 1;
  };
  for (const Layout& layout :
       {Layout{2, "--tensor-parallel 2",
               "TP 2 x 1 replicas (attention heads and the shared expert), routed experts on "
               "each TP rank's share",
               ""},
        // Every TP rank computing every row's routed experts.
        Layout{2, "--tensor-parallel 2 --tensor-parallel-duplicate-experts",
               "TP 2 x 1 replicas (attention heads and the shared expert), routed experts on all",
               ""},
        Layout{4, "--tensor-parallel 2", "TP 2 x 2 replicas", ""},
        Layout{2, "--tensor-parallel 2 --tensor-parallel-attention-only",
               "TP 2 x 1 replicas (attention heads)", ""},
        // TP x EP: each TP rank's EP group is that TP rank of both TP groups; the two TP groups
        // generate and train what the two data-parallel ranks do.
        // (each TP rank dispatching its share of its group's tokens, or all of them)
        Layout{4, "--tensor-parallel 2 --expert-parallel 2", "TP 2 x 2 replicas",
               "EP 2 x 1 replicas (EP groups: the ranks of one TP rank in consecutive TP groups, "
               "each expert on every rank of its TP group, each TP rank dispatching its share"},
        Layout{4, "--tensor-parallel 2 --expert-parallel 2 --tensor-parallel-duplicate-experts",
               "TP 2 x 2 replicas",
               "EP 2 x 1 replicas (EP groups: the ranks of one TP rank in consecutive TP groups, "
               "each expert on every rank of its TP group, computing the group's tokens on each"},
        // Training's experts in 2 overlap chunks, split or duplicated.
        Layout{4, "--tensor-parallel 2 --expert-parallel 2 --ep-overlap-chunks 2",
               "TP 2 x 2 replicas", "EP 2 x 1 replicas", 2, 2, 2},
        Layout{4,
               "--tensor-parallel 2 --expert-parallel 2 --ep-overlap-chunks 2 "
               "--tensor-parallel-duplicate-experts",
               "TP 2 x 2 replicas", "EP 2 x 1 replicas", 2, 2, 2},
        Layout{4, "--tensor-parallel 2 --actor-tensor-parallel 1", "TP 2 x 2 replicas", "", 2, 1},
        // TP x EP generating data-parallel: each rank the whole dense model with its training
        // experts, over its training EP group.
        Layout{4, "--tensor-parallel 2 --expert-parallel 2 --actor-tensor-parallel 1",
               "TP 2 x 2 replicas", "EP 2 x 1 replicas", 2, 1},
        Layout{4, "--tensor-parallel 4 --actor-tensor-parallel 2", "TP 4 x 1 replicas", "", 4, 2},
        // TP 4 x EP 2 generating at TP 2 (8 ranks): a generation TP group lies inside a training
        // one, whose ranks hold the same experts, so each rank generates with its training
        // experts over its training EP group.
        Layout{8, "--tensor-parallel 4 --expert-parallel 2 --actor-tensor-parallel 2",
               "TP 4 x 2 replicas", "EP 2 x 1 replicas", 4, 2}}) {
    SCOPED_TRACE(std::to_string(layout.ranks) + " ranks " + layout.options);
    const std::string dir = temp_dir("tp");
    const Result tp =
        test::run_rlfusion(kFusedRun + layout.options + " --run-dir " + dir, layout.ranks);
    ASSERT_EQ(tp.exit_code, 0) << tp.output;
    EXPECT_EQ(test::json_number(tp.output, "tensor_parallel"), layout.tp);
    EXPECT_NE(tp.output.find("# tensor parallelism: " + layout.log), std::string::npos)
        << tp.output;
    if (!layout.expert_log.empty()) {
      EXPECT_NE(tp.output.find("# expert parallelism: " + layout.expert_log), std::string::npos)
          << tp.output;
    }
    // Generation at the training degree runs on the training slices; at a lower one each phase
    // regroups the TP mates' slices.
    EXPECT_EQ(test::json_number(tp.output, "actor_tensor_parallel"), layout.generation_tp);
    if (layout.overlap_chunks > 1) {
      EXPECT_NE(tp.output.find("training's experts in " + std::to_string(layout.overlap_chunks) +
                               " overlap chunk(s)"),
                std::string::npos)
          << tp.output;
    }
    if (layout.generation_tp < layout.tp) {
      EXPECT_GT(test::json_number(tp.output, "generation_switch_bytes"), 0);
    } else {
      EXPECT_EQ(test::json_number(tp.output, "generation_switch_bytes"), 0);
    }
    // The same samples (sampling is keyed by sample id, the logits equal up to float rounding)
    // and the same data-parallel math.
    EXPECT_EQ(test::json_number(tp.output, "heldout_accuracy_before_rl"),
              test::json_number(dp.output, "heldout_accuracy_before_rl"));
    EXPECT_NEAR(test::json_number(tp.output, "heldout_accuracy_after_rl"),
                test::json_number(dp.output, "heldout_accuracy_after_rl"), 0.07);
    EXPECT_EQ(step_rewards(tp.output), dp_steps) << tp.output;
    // The saved model is the whole one, gathered from the TP slices: after 6 AdamW steps it is
    // the data-parallel run's up to float rounding (measured 1.5e-8 normalized squared error; a
    // model that trained on other data or a misplaced slice is off by many orders more).
    const std::vector<float> tp_model = test::read_tiny_parameters(dir + "/model.h5");
    EXPECT_LT(test::nmse(tp_model.data(), dp_model.data(), dp_model.size()), 1e-6);
  }
}

// Training at TP 1 generating at TP G (--actor-tensor-parallel G alone): data-parallel ranks cut
// their generation slices from their own models (nothing received; with EP, generation TP groups
// of the ranks holding one expert block), pipeline stages receive their slice of the other stages
// (a generation TP group may span pipelines: PP 2 generating at TP 4 on 4 ranks). Every layout
// trains like the data-parallel fused run: the same rewards every step and the saved model within
// float rounding.
TEST(TensorParallelTrain, DataParallelAndPipelineTrainingGenerateAtATensorParallelDegree) {
  const std::string dp_dir = temp_dir("dp-generation");
  const Result dp = test::run_rlfusion(kFusedRun + "--run-dir " + dp_dir, 2);
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  const std::vector<float> dp_model = test::read_tiny_parameters(dp_dir + "/model.h5");
  const std::vector<std::vector<std::string>> dp_rows = test::progress_rows(dp.output, 5);
  ASSERT_EQ(dp_rows.size(), 6u) << dp.output;
  struct Layout {
    int ranks;
    std::string options;
    int generation_tp;
    bool receives;
  };
  for (const Layout& layout :
       {Layout{2, "--actor-tensor-parallel 2", 2, false},
        Layout{2, "--pipeline-parallel 2 --actor-tensor-parallel 2", 2, true},
        Layout{4, "--pipeline-parallel 2 --actor-tensor-parallel 4", 4, true},
        // EP 2 training: each generation TP group is the ranks holding one expert block ({0, 2}
        // and {1, 3}), generating over the training EP groups; nothing moves. With a spare slot
        // per rank and rebalancing every step too (the slots where training put them).
        Layout{4, "--expert-parallel 2 --actor-tensor-parallel 2", 2, false},
        Layout{4,
               "--expert-parallel 2 --redundant-experts 1 --rebalance-every 1 "
               "--actor-tensor-parallel 2",
               2, false},
        // PP 2 x EP 2: the generation TP groups are the two pipelines (the ranks holding one
        // expert block in the stage-major order), each stage receiving its slice of the other.
        Layout{4, "--pipeline-parallel 2 --expert-parallel 2 --actor-tensor-parallel 2", 2, true},
        // 4 pipelines: the groups ({0, 4}, {2, 6}, {1, 5}, {3, 7}) span pipelines, so a
        // pipeline's ranks keep blocks that are not consecutive (0 and 4 for ranks 0 and 1),
        // which its rollout hand-off fetches range by range.
        Layout{8, "--pipeline-parallel 2 --expert-parallel 2 --actor-tensor-parallel 2", 2,
               true}}) {
    SCOPED_TRACE(std::to_string(layout.ranks) + " ranks " + layout.options);
    const std::string dir = temp_dir("generation-tp");
    const Result run =
        test::run_rlfusion(kFusedRun + layout.options + " --run-dir " + dir, layout.ranks);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(test::json_number(run.output, "actor_tensor_parallel"), layout.generation_tp);
    if (layout.receives) {
      EXPECT_GT(test::json_number(run.output, "generation_switch_bytes"), 0);
    } else {
      EXPECT_EQ(test::json_number(run.output, "generation_switch_bytes"), 0);
      const std::string ranks = std::to_string(layout.ranks);
      EXPECT_NE(run.output.find("# layout switch: training data-parallel on all " + ranks +
                                " ranks, generation at TP 2 on " +
                                std::to_string(layout.ranks / 2) + " TP groups"),
                std::string::npos)
          << run.output;
      if (layout.options.find("--expert-parallel") != std::string::npos) {
        EXPECT_NE(run.output.find("each group the ranks holding one expert block, generating "
                                  "over the training EP groups"),
                  std::string::npos)
            << run.output;
      }
    }
    // (Every progress row, the migration lines between them skipped.)
    EXPECT_EQ(test::progress_rows(run.output, 5), dp_rows) << run.output;
    test::expect_trace_counts_tokens_like(dp_dir, dir);
    const std::vector<float> model = test::read_tiny_parameters(dir + "/model.h5");
    EXPECT_LT(test::nmse(model.data(), dp_model.data(), dp_model.size()), 1e-6);
  }
}

// From a parameter file (each rank keeps its slice) with a KL term (the frozen reference is a TP
// model too): TP 2 gives the one-rank run's start and its first two steps, the second with a
// non-zero KL to the reference.
TEST(TensorParallelTrain, StartsFromAParameterFileWithAKlReferenceLikeOneRank) {
  const std::string init_dir = temp_dir("init");
  const Result init = test::run_rlfusion(
      "train --model tiny --task sort --sft-steps 60 --sft-learning-rate 0.01 --steps 1 "
      "--prompts 4 --group-size 2 --eval-prompts 8 --json --run-dir " +
      init_dir);
  ASSERT_EQ(init.exit_code, 0) << init.output;
  const std::string from_file =
      "train --model tiny --task sort --sft-steps 0 --kl-coef 0.05 --steps 2 --prompts 8 "
      "--group-size 4 --eval-prompts 32 --log-every 1 --json --init " +
      init_dir + "/model.h5 ";
  const Result one = test::run_rlfusion(from_file + "--run-dir " + temp_dir("one"));
  const Result tp = test::run_rlfusion(
      from_file + "--mode fused --tensor-parallel 2 --run-dir " + temp_dir("tp-init"), 2);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(tp.exit_code, 0) << tp.output;
  EXPECT_EQ(test::json_number(tp.output, "heldout_accuracy_before_rl"),
            test::json_number(one.output, "heldout_accuracy_before_rl"));
  const std::vector<std::string> want = step_rewards(one.output);
  ASSERT_EQ(want.size(), 2u) << one.output;
  EXPECT_EQ(step_rewards(tp.output), want) << tp.output;
}

long long sum(const std::vector<long long>& values) {
  long long total = 0;
  for (long long v : values) total += v;
  return total;
}

// Router statistics at TP x EP: with the token split each TP rank counts the share it dispatched,
// duplicated only TP rank 0 counts its group's tokens; either way `report` gives each layer the
// assignments of the EP 2 run of the same samples on 2 ranks (counted on every TP rank they would
// be twice as many). The expert rows in summary.json: each split TP rank computes part of what a
// duplicated one does, the 4 split ranks together half the duplicated ones' (each token once, not
// twice), and the split ran one TP allgather of rows per MoE layer forward and backward. The same
// assignments with training's experts in overlap chunks.
TEST(TensorParallelTrain, ExpertParallelRouterStatisticsCountEveryTokenOnce) {
  std::vector<double> want;
  std::vector<long long> split_rows, duplicated_rows;
  for (const auto& [ranks, options] :
       {std::pair<int, std::string>{2, "--expert-parallel 2 "},
        {4, "--tensor-parallel 2 --expert-parallel 2 "},
        {4, "--tensor-parallel 2 --expert-parallel 2 --tensor-parallel-duplicate-experts "}}) {
    SCOPED_TRACE(options);
    const std::string dir = temp_dir("router-" + std::to_string(ranks));
    const Result run = test::run_rlfusion(kFusedRun + options + "--run-dir " + dir, ranks);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const Result report = test::run_rlfusion("report " + dir + " --json");
    ASSERT_EQ(report.exit_code, 0) << report.output;
    std::vector<double> assignments;
    for (const int layer : {0, 1}) {
      const size_t at = report.output.find("{\"layer\":" + std::to_string(layer) + ",");
      ASSERT_NE(at, std::string::npos) << report.output;
      assignments.push_back(test::json_number(report.output, "assignments", at));
    }
    ASSERT_GT(assignments[0], 0) << report.output;
    if (want.empty()) want = assignments;
    EXPECT_EQ(assignments, want) << report.output;
    const std::vector<long long> rows = test::json_integers(run.output, "expert_rows_per_rank");
    ASSERT_EQ(rows.size(), size_t(ranks)) << run.output;
    if (ranks == 2) continue;
    const bool split = options.find("duplicate") == std::string::npos;
    EXPECT_NE(run.output.find(std::string("\"tensor_expert_split\":") + (split ? "true" : "false")),
              std::string::npos)
        << run.output;
    EXPECT_EQ(test::json_number(run.output, "tp_allgathers") > 0, split) << run.output;
    // The fit check counts a TP rank's generation on its slice (its heads' KV cache), not the
    // unsliced model's (1.7x the measured peak before).
    test::expect_generation_peak_counted(run.output, 0.8);
    (split ? split_rows : duplicated_rows) = rows;
  }
  ASSERT_EQ(split_rows.size(), 4u);
  ASSERT_EQ(duplicated_rows.size(), 4u);
  // Duplicated, both TP ranks of a group compute the same rows (ranks 0, 1 and 2, 3 are TP
  // groups; rank r's experts are EP rank r / 2's).
  EXPECT_EQ(duplicated_rows[0], duplicated_rows[1]);
  EXPECT_EQ(duplicated_rows[2], duplicated_rows[3]);
  EXPECT_EQ(split_rows[0] + split_rows[1], duplicated_rows[0]);
  EXPECT_EQ(split_rows[2] + split_rows[3], duplicated_rows[2]);
  EXPECT_EQ(2 * sum(split_rows), sum(duplicated_rows));
  // Training's experts in overlap chunks (their dispatchers count what they sent), split and
  // duplicated: still every token once.
  for (const std::string duplicate : {"", "--tensor-parallel-duplicate-experts "}) {
    SCOPED_TRACE(duplicate);
    const std::string dir = temp_dir("router-chunks");
    const Result run = test::run_rlfusion(
        kFusedRun + "--tensor-parallel 2 --expert-parallel 2 --ep-overlap-chunks 2 " + duplicate +
            "--run-dir " + dir,
        4);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const Result report = test::run_rlfusion("report " + dir + " --json");
    ASSERT_EQ(report.exit_code, 0) << report.output;
    for (const int layer : {0, 1}) {
      const size_t at = report.output.find("{\"layer\":" + std::to_string(layer) + ",");
      ASSERT_NE(at, std::string::npos) << report.output;
      EXPECT_EQ(test::json_number(report.output, "assignments", at), want[size_t(layer)])
          << report.output;
    }
  }
}

// TP without EP: each TP rank computes its share of its group's tokens' routed experts on its own
// copy of them (the token split, the default) instead of all of them (duplicated). Counted: the
// split ranks' rows add up to what each duplicated rank computes, and the split ran TP allgathers
// of rows; both train like each other (the saved models within float rounding).
TEST(TensorParallelTrain, TokenSplitWithoutExpertParallelismComputesEachRowOnce) {
  std::vector<long long> split_rows, duplicated_rows;
  std::vector<float> split_model, duplicated_model;
  for (const bool split : {true, false}) {
    SCOPED_TRACE(split ? "split" : "duplicated");
    const std::string dir = temp_dir(split ? "split" : "duplicated");
    const Result run = test::run_rlfusion(
        kFusedRun + "--tensor-parallel 2 " + (split ? "" : "--tensor-parallel-duplicate-experts ") +
            "--run-dir " + dir,
        2);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find(std::string("\"tensor_expert_split\":") + (split ? "true" : "false")),
              std::string::npos)
        << run.output;
    EXPECT_EQ(test::json_number(run.output, "tp_allgathers") > 0, split) << run.output;
    // The fit check counts a TP rank's generation on its slice (its heads' KV cache), not the
    // unsliced model's (1.7x the measured peak before).
    test::expect_generation_peak_counted(run.output, 0.8);
    (split ? split_rows : duplicated_rows) =
        test::json_integers(run.output, "expert_rows_per_rank");
    (split ? split_model : duplicated_model) = test::read_tiny_parameters(dir + "/model.h5");
  }
  ASSERT_EQ(split_rows.size(), 2u);
  ASSERT_EQ(duplicated_rows.size(), 2u);
  EXPECT_GT(split_rows[0], 0);
  EXPECT_GT(split_rows[1], 0);
  EXPECT_EQ(duplicated_rows[0], duplicated_rows[1]);
  EXPECT_EQ(split_rows[0] + split_rows[1], duplicated_rows[0]);
  ASSERT_EQ(split_model.size(), duplicated_model.size());
  EXPECT_LT(test::nmse(split_model.data(), duplicated_model.data(), split_model.size()), 1e-6);
}

TEST(TensorParallelTrain, DegreesThatDoNotFitStopEveryRankBeforeOutput) {
  test::expect_stops_before_output(
      {
          {2, "--tensor-parallel 3",
           "--tensor-parallel 3: does not divide the 2 ranks it is made of"},
          {4, "--tensor-parallel 8",
           "--tensor-parallel 8: does not divide the 4 ranks it is made of"},
          {2, "--tensor-parallel 0", "--tensor-parallel 0: must be a positive integer"},
          {2, "--mode disaggregated --tensor-parallel 2",  // (1 actor, 1 learner)
           "--tensor-parallel 2 with --mode disaggregated: does not divide the 1 learner ranks"},
          {2, "--mode fused-all --tensor-parallel 2",
           "--tensor-parallel 2 is not supported outside --mode fused"},
          {2, "--tensor-parallel 2 --expert-parallel 2",
           "--tensor-parallel 2 x --expert-parallel 2: the EP degree must divide the 1 "
           "tensor-parallel groups"},
          {4, "--tensor-parallel 2 --expert-parallel 2 --actor-expert-parallel 1",
           "--tensor-parallel 2 x --expert-parallel 2: --actor-expert-parallel must be the same "
           "degree"},
          {2, "--tensor-parallel 2 --rebalance-every 1",
           "--rebalance-every needs --expert-parallel >= 2"},
          {2, "--tensor-parallel-attention-only",
           "--tensor-parallel-attention-only needs --tensor-parallel 2 or more"},
          {2, "--expert-parallel 2 --tensor-parallel-duplicate-experts",
           "--tensor-parallel-duplicate-experts needs --tensor-parallel or "
           "--actor-tensor-parallel of 2 or more"},
          {1, "--tensor-parallel 2", "--tensor-parallel 2 is not supported on one rank"},
      },
      temp_dir("bad"));
}

}  // namespace
}  // namespace rlf
