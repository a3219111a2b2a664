// `train --mode fused --tensor-parallel 2 --pipeline-parallel 2` on 4 ranks (TP inside every
// pipeline stage, one model replica on the 4 ranks; generation data-parallel on every rank after
// the layout switch) trains like the data-parallel fused run of the same prompts: the same
// held-out accuracy before RL and after, the same reward every step, and a saved whole model
// within float rounding of it; under 1F1B and, on a 4-layer model, the interleaved schedule. The
// replica's samples come through DistQueue, one get per replica and shard each step: 1/(TP x PP)
// of every rank fetching its own copy. With --actor-tensor-parallel 2 generation runs at TP 2 after
// the switch (each rank borrowing only its TP slice of the other stage) and trains the same, with
// fewer switch bytes than the default data-parallel generation; so does TP 4 x PP 2 on 8 ranks
// generating at TP 2 (slices regrouped inside each stage's TP group). Shapes and degrees that do
// not fit stop every rank with exit code 2 before any output.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/app/fused_train_runs.h"
#include "tests/app/json_output.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

using Result = test::CommandResult;

std::string temp_dir(const std::string& name) {
  return test::fresh_temp_dir("tp-pp-" + name);
}

const std::string& kFusedRun = test::kModelParallelFusedRun;

TEST(TensorPipelineTrain, TrainsLikeTheDataParallelFusedRun) {
  const std::string dp_dir = temp_dir("dp"), dir = temp_dir("tp-pp");
  const Result dp = test::run_rlfusion(kFusedRun + "--run-dir " + dp_dir, 2);
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  const Result run = test::run_rlfusion(
      kFusedRun + "--tensor-parallel 2 --pipeline-parallel 2 --run-dir " + dir, 4);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(test::json_number(run.output, "tensor_parallel"), 2);
  EXPECT_EQ(test::json_number(run.output, "pipeline_parallel"), 2);
  // Each of the replica's 4 ranks generated 8 samples, one --micro-batch (64) each.
  EXPECT_EQ(test::json_number(run.output, "micro_batches"), 4);
  EXPECT_NEAR(test::json_number(run.output, "pipeline_bubble_formula"), 1.0 / 5.0, 1e-4);
  EXPECT_NE(run.output.find("# pipeline parallelism: PP 2 x 1 pipelines, 1F1B, 4 micro-batches"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("# tensor parallelism: TP 2 x 2 replicas (the stages of the "
                            "pipelines below)"),
            std::string::npos)
      << run.output;
  // One leader for the 4 ranks of the replica asks each of the 2 queue shards once a step: 12
  // requests in 6 steps, against 48 with every rank fetching its own copy.
  EXPECT_EQ(test::json_number(run.output, "queue_replica_ranks"), 4);
  EXPECT_EQ(test::json_number(run.output, "queue_get_requests"), 6 * 1 * 2);
  EXPECT_EQ(test::json_number(run.output, "heldout_accuracy_before_rl"),
            test::json_number(dp.output, "heldout_accuracy_before_rl"));
  EXPECT_NEAR(test::json_number(run.output, "heldout_accuracy_after_rl"),
              test::json_number(dp.output, "heldout_accuracy_after_rl"), 0.07);
  // The saved model is the whole one, gathered from the stages' TP slices (a norm that counted a
  // whole tensor twice is off too).
  test::expect_trains_like(dp, dp_dir, run, dir, 6);
  EXPECT_EQ(test::json_number(run.output, "actor_tensor_parallel"), 1);

  // Generation at TP 2: the same samples (each TP group generates the prompts of its two ranks,
  // which then train one half each), the same training.
  const std::string tp_dir = temp_dir("tp-pp-gen-tp");
  const Result tp_generation =
      test::run_rlfusion(kFusedRun +
                             "--tensor-parallel 2 --pipeline-parallel 2 --actor-tensor-parallel 2 "
                             "--run-dir " +
                             tp_dir,
                         4);
  ASSERT_EQ(tp_generation.exit_code, 0) << tp_generation.output;
  EXPECT_EQ(test::json_number(tp_generation.output, "actor_tensor_parallel"), 2);
  EXPECT_NE(
      tp_generation.output.find("generation at TP 2 on 2 TP groups (--actor-tensor-parallel)"),
      std::string::npos)
      << tp_generation.output;
  test::expect_trains_like(dp, dp_dir, tp_generation, tp_dir, 6);
  // Rank 0 receives its TP slice of the other stage, not the other stage whole and its TP mate's
  // slices of its own.
  const double switch_bytes = test::json_number(tp_generation.output, "generation_switch_bytes");
  EXPECT_GT(switch_bytes, 0);
  EXPECT_LT(switch_bytes, test::json_number(run.output, "generation_switch_bytes"));

  // TP 4 x PP 2 on 8 ranks generating at TP 2: each rank regroups its stage's slices with its TP
  // mates, borrows its TP 2 slice of the other stage, and trains its share of its pair's samples.
  const std::string regrouped_dir = temp_dir("tp4-pp-gen-tp2");
  const Result regrouped = test::run_rlfusion(
      kFusedRun + "--tensor-parallel 4 --pipeline-parallel 2 --actor-tensor-parallel 2 --run-dir " +
          regrouped_dir,
      8);
  ASSERT_EQ(regrouped.exit_code, 0) << regrouped.output;
  EXPECT_NE(regrouped.output.find("generation at TP 2 on 4 TP groups (--actor-tensor-parallel)"),
            std::string::npos)
      << regrouped.output;
  test::expect_trains_like(dp, dp_dir, regrouped, regrouped_dir, 6);
}

// Interleaved 1F1B (2 chunks per rank) inside TP 2 on a 4-layer `tiny`: each rank's 8 samples in
// micro-batches of 4 make 8 micro-batches per step for the replica's 4 ranks.
TEST(TensorPipelineTrain, InterleavedScheduleTrainsLikeTheDataParallelFusedRun) {
  const std::string run = test::interleaved_fused_run(temp_dir("model"));
  const std::string dp_dir = temp_dir("dp4"), dir = temp_dir("tp-pp4");
  const Result dp = test::run_rlfusion(run + "--run-dir " + dp_dir, 2);
  const Result tp_pp = test::run_rlfusion(
      run + "--tensor-parallel 2 --pipeline-parallel 2 --virtual-stages 2 --run-dir " + dir, 4);
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  ASSERT_EQ(tp_pp.exit_code, 0) << tp_pp.output;
  EXPECT_NE(tp_pp.output.find("# pipeline parallelism: PP 2 x 1 pipelines, interleaved 1F1B, 8 "
                              "micro-batches per step, 2 virtual stage(s)"),
            std::string::npos)
      << tp_pp.output;
  test::expect_trains_like(dp, dp_dir, tp_pp, dir, 3);
}

TEST(TensorPipelineTrain, ShapesThatDoNotFitStopEveryRankBeforeOutput) {
  test::expect_stops_before_output(
      {
          {4, "--tensor-parallel 2 --pipeline-parallel 4",
           "--tensor-parallel 2 x --pipeline-parallel 4 = 8 ranks per model replica must divide "
           "the 4 ranks"},
          {2, "--tensor-parallel 2 --pipeline-parallel 2",
           "--tensor-parallel 2 x --pipeline-parallel 2 = 4 ranks per model replica must divide "
           "the 2 ranks"},
          {4, "--tensor-parallel 2 --pipeline-parallel 2 --virtual-stages 2",
           "--pipeline-parallel 2 x --virtual-stages 2 = 4 model chunks must divide the model's 2 "
           "layers"},
          {6, "--tensor-parallel 3 --pipeline-parallel 2",
           "--tensor-parallel 3: does not divide the 4 attention heads of model tiny"},
          {4, "--tensor-parallel 2 --pipeline-parallel 2 --actor-tensor-parallel 4",
           "--actor-tensor-parallel 4 with --tensor-parallel 2: must divide the training TP "
           "degree"},
          // Training at TP 1 generating at TP G: what is not built, and degrees that do not fit.
          {2, "--actor-tensor-parallel 2 --expert-parallel 2",
           "--actor-tensor-parallel 2 without --tensor-parallel, with --expert-parallel 2: TP 2 x "
           "EP 2 = 4 must divide the 2 ranks"},
          {4, "--actor-tensor-parallel 2 --expert-parallel 2 --actor-expert-parallel 1",
           "--actor-tensor-parallel 2 without --tensor-parallel, with --expert-parallel 2: "
           "--actor-expert-parallel must be the same degree"},
          {2, "--mode fused-all --actor-tensor-parallel 2",
           "--actor-tensor-parallel 2 without --tensor-parallel is only built in --mode fused"},
          {2, "--actor-tensor-parallel 2 --reorder-samples counted",
           "--actor-tensor-parallel 2 without --tensor-parallel is not supported with "
           "--reorder-samples"},
          {4, "--actor-tensor-parallel 3",
           "--actor-tensor-parallel 3: does not divide the 4 ranks it is made of"},
          {1, "--actor-tensor-parallel 2",
           "--actor-tensor-parallel 2 is not supported on one rank"},
          {4, "--tensor-parallel 2 --pipeline-parallel 2 --actor-tensor-parallel -1",
           "--actor-tensor-parallel -1: must be a positive integer"},
      },
      temp_dir("bad"));
}

}  // namespace
}  // namespace rlf
