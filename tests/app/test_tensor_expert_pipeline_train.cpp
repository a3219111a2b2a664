// `train --mode fused --tensor-parallel 2 --pipeline-parallel 2 --expert-parallel 2` on 8 ranks
// (TP x EP x PP: TP groups inside every stage, the pipelines of each TP rank, EP groups of one TP
// rank and stage in 2 model replicas), with the token split, with duplicated expert work and with
// the split's rows in 2 overlap chunks per MoE layer (--ep-overlap-chunks 2) and with a forward
// paired with another micro-batch's backward (--pipeline-pairing, in the alternating order):
// trains like the data-parallel fused run of the same prompts on 2 ranks (generation
// data-parallel on every rank after the switch that gathers the TP slices and stages with the
// replica's experts): the same held-out accuracy before and after RL, the same reward every step,
// a saved whole model within float rounding of it, one DistQueue leader per model replica.
// Layouts that do not fit, and combinations not built, stop every rank with exit code 2 before any
// output. (Offload:
// test_model_parallel_offload.cpp; rebalancing: test_rebalance_in_train.cpp; checkpoints:
// test_checkpoints.cpp.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/app/fused_train_runs.h"
#include "tests/app/json_output.h"
#include "tests/app/read_parameters.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

using Result = test::CommandResult;

const std::string kLayout = "--tensor-parallel 2 --pipeline-parallel 2 --expert-parallel 2 ";

TEST(TensorExpertPipelineTrain, TrainsLikeTheDataParallelFusedRun) {
  const std::string dp_dir = test::fresh_temp_dir("dp");
  const Result dp = test::run_rlfusion(test::kModelParallelFusedRun + "--run-dir " + dp_dir, 2);
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  // (--actor-expert-parallel 1: a generation EP degree of its own; after the pipeline's switch,
  // each rank's TP slice of every layer with its replica's experts, the layout switch over its TP
  // rank's stage-major order gives it every expert, 4 buckets.)
  for (const std::string variant :
       {"", "--tensor-parallel-duplicate-experts ", "--ep-overlap-chunks 2 ", "--pipeline-pairing ",
        "--actor-expert-parallel 1 "}) {
    SCOPED_TRACE(variant.empty() ? "token split" : variant);
    const std::string dir = test::fresh_temp_dir("tp-ep-pp");
    const Result run = test::run_rlfusion(
        test::kModelParallelFusedRun + kLayout + variant + "--run-dir " + dir, 8);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(test::json_number(run.output, "tensor_parallel"), 2);
    EXPECT_EQ(test::json_number(run.output, "pipeline_parallel"), 2);
    EXPECT_EQ(test::json_number(run.output, "expert_parallel"), 2);
    const bool split = variant.find("duplicate") == std::string::npos;
    EXPECT_EQ(run.output.find("\"tensor_expert_split\":true") != std::string::npos, split)
        << run.output;
    if (variant.find("--actor-expert-parallel 1") != std::string::npos) {
      EXPECT_NE(run.output.find("# layout switch: training EP 2, generation EP 1 (experts moved "
                                "rank to rank before each generation phase: 4 expert buckets"),
                std::string::npos)
          << run.output;
    }
    const bool chunked = variant.find("--ep-overlap-chunks 2") != std::string::npos;
    EXPECT_EQ(test::json_number(run.output, "ep_overlap_chunks"), chunked ? 2 : 1) << run.output;
    EXPECT_NE(run.output.find("# tensor parallelism: TP 2 x 4 replicas (the stages of the "
                              "pipelines below)"),
              std::string::npos)
        << run.output;
    EXPECT_NE(run.output.find("(EP groups: the ranks of one TP rank and stage in consecutive "
                              "model replicas, " +
                              std::string(split ? "each TP rank dispatching its share"
                                                : "computing the TP group's tokens")),
              std::string::npos)
        << run.output;
    // With pairing, stage 0 (ranks 0 and 1 of each model replica) pairs a forward with a
    // backward 3 times a step (4 micro-batches: F0, then F1 with B0, F2 with B1, F3 with B2, then
    // B3), 18 in 6 steps; the last stage never.
    const bool pairing = variant.find("--pipeline-pairing") != std::string::npos;
    const std::string key = "\"pipeline_pairs\":[";
    const size_t pairs_at = run.output.find(key);
    ASSERT_NE(pairs_at, std::string::npos) << run.output;
    const size_t first = pairs_at + key.size();
    EXPECT_EQ(run.output.substr(first, run.output.find(']', first) - first),
              pairing ? "18,18,0,0,18,18,0,0" : "0,0,0,0,0,0,0,0")
        << run.output;
    EXPECT_EQ(test::json_number(run.output, "micro_batches"), 4);
    // One leader per model replica (2 of them, 4 ranks each) asks each of the 2 queue shards once
    // a step.
    EXPECT_EQ(test::json_number(run.output, "queue_get_requests"), 6 * 2 * 2);
    EXPECT_EQ(test::json_number(run.output, "queue_replica_ranks"), 4);
    // The switch brings each rank its TP mate's slices and the other stage.
    EXPECT_GT(test::json_number(run.output, "generation_switch_bytes"), 0);
    EXPECT_EQ(test::json_number(run.output, "heldout_accuracy_before_rl"),
              test::json_number(dp.output, "heldout_accuracy_before_rl"));
    EXPECT_NEAR(test::json_number(run.output, "heldout_accuracy_after_rl"),
                test::json_number(dp.output, "heldout_accuracy_after_rl"), 0.07);
    test::expect_trains_like(dp, dp_dir, run, dir, 6);
  }
}

TEST(TensorExpertPipelineTrain, LayoutsThatDoNotFitStopEveryRankBeforeOutput) {
  test::expect_stops_before_output(
      {
          {8, kLayout + "--actor-expert-parallel 4",
           "--pipeline-parallel 2 x --actor-expert-parallel 4: the generation EP degree must "
           "divide the 2 model replicas"},
          {8, "--tensor-parallel 2 --pipeline-parallel 2 --expert-parallel 4",
           "--pipeline-parallel 2 x --expert-parallel 4: the EP degree must divide the 2 model "
           "replicas (T x P ranks)"},
      },
      test::fresh_temp_dir("bad"));
}

}  // namespace
}  // namespace rlf
