// `train --mode fused --pipeline-parallel`: PP 2 on 2 ranks, PP 2 x DP 2 on 4 ranks and PP 2 x EP 2
// on 4 ranks (expert parallelism inside the stages, also with --ep-overlap-chunks 2: every MoE
// layer of every micro-batch in overlapped chunks, and with --pipeline-pairing: the schedule's
// forward / backward pairs with their MoE exchanges interleaved) train like the data-parallel fused
// run of the same prompts (generation data-parallel on every rank from the borrowed layers,
// training stage by stage under 1F1B): the same held-out accuracy before and after RL, the same
// reward every step, and a saved whole model within float rounding of it. The pipeline's samples
// come through DistQueue, one get per pipeline and shard each step. Shapes and combinations that do
// not fit stop every rank with exit code 2 before any output. Stage balancing
// (--pipeline-balance: uneven chunks) trains like the data-parallel run too, and so does
// generation inside the pipelines (--actor-pipeline-parallel). (Several minibatches, a KL term
// and checkpoints with PP: test_pipeline_parallel_state.cpp and test_checkpoints.cpp.)
#include <gtest/gtest.h>

#include <cmath>
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
  return test::fresh_temp_dir("pp-" + name);
}

const std::string& kFusedRun = test::kModelParallelFusedRun;

// The stage activation arenas' measured use (chunks in flight x the largest use, the busiest
// rank's) against what the fit check counted for them: within 20% below it, and never above it
// without EP (`bound`; with EP the analytic counts each rank's balanced share of the routed rows,
// which the routing's imbalance can exceed); and the training peak with them.
void expect_activations_counted(const std::string& output, bool bound) {
  const double measured = test::json_number(output, "pipeline_activation_bytes");
  const double counted = test::json_number(output, "pipeline_activation_bytes_analytic");
  EXPECT_GT(measured, 0.0) << output;
  EXPECT_GE(measured, 0.8 * counted) << output;
  if (bound) {
    EXPECT_LE(measured, counted) << output;
  }
  // The measured training peak adds the arenas to the device arena's training phase, as the fit
  // check's count does (device memory beside the arena): within 20% of that count.
  const size_t peaks = output.find("\"device_memory_peaks\"");
  ASSERT_NE(peaks, std::string::npos) << output;
  const double training = test::json_number(output, "training", peaks);
  const double training_counted = test::json_number(output, "training_analytic", peaks);
  EXPECT_GE(training, measured) << output;
  EXPECT_GE(training, 0.8 * training_counted) << output;
  EXPECT_LE(training, 1.2 * training_counted) << output;
  // So does the progress table's device-peak column (value and unit, the 8th and 9th fields).
  const auto rows = test::progress_rows(output, 9);
  ASSERT_FALSE(rows.empty()) << output;
  const std::vector<std::string>& last = rows.back();
  ASSERT_EQ(last.size(), 9u) << output;
  const double scale = last[8] == "MiB" ? 1048576.0 : last[8] == "KiB" ? 1024.0 : 1.0;
  EXPECT_GE(std::stod(last[7]) * scale, 0.99 * measured) << output;
}

TEST(PipelineParallelTrain, TrainsLikeTheDataParallelFusedRun) {
  const std::string dp_dir = temp_dir("dp");
  const Result dp = test::run_rlfusion(kFusedRun + "--run-dir " + dp_dir, 2);
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  const std::vector<float> dp_model = test::read_tiny_parameters(dp_dir + "/model.h5");
  const std::vector<std::string> dp_steps = test::step_rewards(dp.output);
  ASSERT_EQ(dp_steps.size(), 6u) << dp.output;
  struct Layout {
    int ranks;
    std::string options;
  };
  for (const Layout& layout : {Layout{2, ""}, Layout{4, ""}, Layout{4, "--expert-parallel 2 "},
                               Layout{4, "--expert-parallel 2 --ep-overlap-chunks 2 "},
                               Layout{4, "--expert-parallel 2 --pipeline-pairing "},
                               Layout{4,
                                      "--expert-parallel 2 --pipeline-pairing "
                                      "--ep-overlap-chunks 2 "}}) {
    const int ranks = layout.ranks;
    SCOPED_TRACE(std::to_string(ranks) + " ranks " + layout.options);
    const int pipelines = ranks / 2;
    const std::string dir = temp_dir("pp");
    const Result pp = test::run_rlfusion(
        kFusedRun + "--pipeline-parallel 2 " + layout.options + "--run-dir " + dir, ranks);
    ASSERT_EQ(pp.exit_code, 0) << pp.output;
    if (!layout.options.empty()) {
      // Each stage's ranks of the 2 pipelines are one EP group holding 2 of `tiny`'s 4 experts.
      EXPECT_EQ(test::json_number(pp.output, "expert_parallel"), 2);
      EXPECT_NE(pp.output.find("# expert parallelism: EP 2 x 1 replicas (EP groups: a stage's "
                               "ranks in consecutive pipelines"),
                std::string::npos)
          << pp.output;
      // The schedule's EP communication per rank, with or without overlap chunks: timed (in
      // flight > 0 on every rank), its exposed part, and the hidden fraction between them.
      const int chunks = layout.options.find("--ep-overlap-chunks 2") != std::string::npos ? 2 : 1;
      EXPECT_EQ(test::json_number(pp.output, "ep_overlap_chunks"), chunks);
      EXPECT_NE(pp.output.find("# PP x EP communication in the schedule, " +
                               std::to_string(chunks) + " overlap chunk(s) per MoE layer"),
                std::string::npos)
          << pp.output;
      // summary.json's per-rank arrays (rank 0's value first).
      auto first_of = [&](const std::string& key) {
        const size_t at = pp.output.find("\"" + key + "\":[");
        return at == std::string::npos ? std::nan("")
                                       : std::stod(pp.output.substr(at + key.size() + 4));
      };
      EXPECT_GT(first_of("ep_communication_seconds"), 0.0) << pp.output;
      EXPECT_GE(first_of("ep_exposed_seconds"), 0.0) << pp.output;
      EXPECT_LE(first_of("ep_hidden_fraction"), 1.0) << pp.output;
      // Rank 0 (stage 0 of 2, 2 micro-batches: F0, then F1 paired with B0, then B1) runs one
      // pair a step with --pipeline-pairing, none without.
      const bool pairing = layout.options.find("--pipeline-pairing") != std::string::npos;
      EXPECT_EQ(first_of("pipeline_pairs"), pairing ? 6.0 : 0.0) << pp.output;
    }
    EXPECT_EQ(test::json_number(pp.output, "pipeline_parallel"), 2);
    // Each rank's 16 samples are one --micro-batch (64): two micro-batches per pipeline.
    EXPECT_EQ(test::json_number(pp.output, "micro_batches"), 2);
    EXPECT_NE(pp.output.find("# pipeline parallelism: PP 2 x " + std::to_string(pipelines) +
                             " pipelines, 1F1B, 2 micro-batches per step"),
              std::string::npos)
        << pp.output;
    // One leader per pipeline asks each of the 2 queue shards once a step (every stage fetching
    // its own copy would ask twice as often).
    EXPECT_EQ(test::json_number(pp.output, "queue_get_requests"), 6 * pipelines * 2);
    const double bubble = test::json_number(pp.output, "pipeline_bubble");
    EXPECT_GE(bubble, 0.0);
    EXPECT_LT(bubble, 1.0);
    EXPECT_NEAR(test::json_number(pp.output, "pipeline_bubble_formula"), 1.0 / 3.0, 1e-4);
    expect_activations_counted(pp.output,
                               layout.options.find("--expert-parallel") == std::string::npos);
    // The same samples (sampling is keyed by sample id, generation runs the whole model) and the
    // same data-parallel math with the same micro-batches.
    EXPECT_EQ(test::json_number(pp.output, "heldout_accuracy_before_rl"),
              test::json_number(dp.output, "heldout_accuracy_before_rl"));
    EXPECT_NEAR(test::json_number(pp.output, "heldout_accuracy_after_rl"),
                test::json_number(dp.output, "heldout_accuracy_after_rl"), 0.07);
    EXPECT_EQ(test::step_rewards(pp.output), dp_steps) << pp.output;
    // The saved model is the whole one, gathered from the stages: after 6 AdamW steps it is the
    // data-parallel run's up to float rounding (a stage that trained other data, a misplaced
    // layer or a norm that counted a stage twice is off by many orders more).
    const std::vector<float> pp_model = test::read_tiny_parameters(dir + "/model.h5");
    EXPECT_LT(test::nmse(pp_model.data(), dp_model.data(), dp_model.size()), 1e-6);
  }
}

// PP x EP generating at an EP degree of its own (--actor-expert-parallel G): after the pipeline's
// switch borrows the other stages' layers with the pipeline's experts, a layout switch over the
// stage-major order (PipelineGroups::stage_major) gives each rank its generation shard from the
// stitched view of its stage and the borrowed layers, receiving the experts it lacks into slots
// (its generation peak within 10% under the fit check's count of that), and generation runs over
// the generation EP groups (a stage's ranks in G consecutive pipelines). Generation is keyed by
// sample id, so every layout trains the data-parallel run's samples: its rewards every step and its
// model within float rounding. PP 2 x EP 2 to G 1 (every expert on every rank: buckets received),
// PP 2 alone to G 2, PP 2 x EP 2 to G 4 on 8 ranks, and G 1 with rebalancing under a skewed router
// (the switch finds each expert through the migrated placement) against the same run generating on
// its training EP groups.
TEST(PipelineParallelTrain, GeneratesAtAnExpertParallelDegreeOfItsOwn) {
  struct Layout {
    int ranks;
    std::string options;
    int training_degree, generation_degree;
    // The run compared with (on as many ranks): the data-parallel one, or with rebalancing under
    // a skewed router the same PP x EP run generating on its training EP groups.
    std::string compared_options = {};
  };
  const std::string skewed = "--rebalance-every 1 --router-skew 4 ";
  for (const Layout& layout :
       {Layout{4, "--expert-parallel 2 --actor-expert-parallel 1 ", 2, 1},
        Layout{4, "--actor-expert-parallel 2 ", 1, 2},
        Layout{8, "--expert-parallel 2 --actor-expert-parallel 4 ", 2, 4},
        Layout{4, "--expert-parallel 2 --actor-expert-parallel 1 " + skewed, 2, 1,
               "--pipeline-parallel 2 --expert-parallel 2 " + skewed}}) {
    SCOPED_TRACE(std::to_string(layout.ranks) + " ranks " + layout.options);
    const std::string compared_dir = temp_dir("gen-ep-compared");
    const Result compared = test::run_rlfusion(
        kFusedRun + layout.compared_options + "--run-dir " + compared_dir, layout.ranks);
    ASSERT_EQ(compared.exit_code, 0) << compared.output;
    const std::string dir = temp_dir("gen-ep");
    const Result pp = test::run_rlfusion(
        kFusedRun + "--pipeline-parallel 2 " + layout.options + "--run-dir " + dir, layout.ranks);
    ASSERT_EQ(pp.exit_code, 0) << pp.output;
    EXPECT_NE(
        pp.output.find("# layout switch: training EP " + std::to_string(layout.training_degree) +
                       ", generation EP " + std::to_string(layout.generation_degree)),
        std::string::npos)
        << pp.output;
    if (layout.generation_degree == 1) {
      // Rank 0 holds 2 of the 4 experts of each of the 2 layers: it receives the other 4.
      EXPECT_NE(pp.output.find("4 expert buckets of"), std::string::npos) << pp.output;
    }
    if (!layout.compared_options.empty()) {
      EXPECT_NE(pp.output.find("# migration after step"), std::string::npos) << pp.output;
    }
    // The stage switches from a stitched view of its own and the borrowed layers: the measured
    // generation peak is what the fit check counts for that (the stage, the other stages' layers
    // and the received buckets, no copy of the stage), within the activations' rounding.
    test::expect_generation_peak_counted(pp.output, 0.9);
    EXPECT_EQ(test::step_rewards(pp.output), test::step_rewards(compared.output)) << pp.output;
    const std::vector<float> compared_model =
        test::read_tiny_parameters(compared_dir + "/model.h5");
    const std::vector<float> pp_model = test::read_tiny_parameters(dir + "/model.h5");
    EXPECT_LT(test::nmse(pp_model.data(), compared_model.data(), compared_model.size()), 1e-6);
  }
}

// The interleaved schedule (2 chunks per rank) on a 4-layer `tiny`: each rank's 16 samples in
// micro-batches of 4 make 8 micro-batches per step; the data-parallel run's rewards at every step
// and its saved model within float rounding.
TEST(PipelineParallelTrain, InterleavedScheduleTrainsLikeTheDataParallelFusedRun) {
  const std::string run = test::interleaved_fused_run(temp_dir("model"));
  const std::string dp_dir = temp_dir("dp4"), pp_dir = temp_dir("pp4");
  const Result dp = test::run_rlfusion(run + "--run-dir " + dp_dir, 2);
  const Result pp =
      test::run_rlfusion(run + "--pipeline-parallel 2 --virtual-stages 2 --run-dir " + pp_dir, 2);
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  ASSERT_EQ(pp.exit_code, 0) << pp.output;
  EXPECT_NE(pp.output.find("# pipeline parallelism: PP 2 x 1 pipelines, interleaved 1F1B, 8 "
                           "micro-batches per step, 2 virtual stage(s)"),
            std::string::npos)
      << pp.output;
  EXPECT_NEAR(test::json_number(pp.output, "pipeline_bubble_formula"), 1.0 / 17.0, 1e-4);
  expect_activations_counted(pp.output, /*bound=*/true);
  test::expect_trains_like(dp, dp_dir, pp, pp_dir, 3);
}

// Generation inside the training pipelines (--actor-pipeline-parallel 2): each stage generates
// from its own layers with the other stages of its pipeline (nothing borrowed), on PP 2 (2 ranks),
// PP 2 x DP 2 (4 ranks), the interleaved schedule's 2 chunks per rank on the 4-layer `tiny`,
// PP 2 with --offload and a KL term, TP 2 x PP 2 (4 ranks: each stage's TP group generating
// from its slices, each TP rank then training its share of its group's samples), PP 2 x EP 2
// (4 ranks: each stage's experts dispatched over the stage in both pipelines) and TP 2 x PP 2 x
// EP 2 (8 ranks), also PP 2 x EP 2 rebalancing with a spare expert slot:
// the data-parallel run's samples (its rewards every step) and its model within float rounding;
// the generation peak within 15% under the fit check's count of it (the stage's KV cache for its
// pipeline's samples, one group's rows) and below the same run borrowing the other stages' layers.
TEST(PipelineParallelTrain, GeneratesInsideThePipelinesLikeTheDataParallelRun) {
  const std::string interleaved = test::interleaved_fused_run(temp_dir("model-pipelined"));
  struct Layout {
    int ranks;
    std::string run, options;
    size_t steps;
  };
  double two_stage_decode_steps = -1;  // the first layout's: one pipeline of 2 ranks
  for (const Layout& layout :
       {Layout{2, kFusedRun, "--pipeline-parallel 2 ", 6},
        Layout{4, kFusedRun, "--pipeline-parallel 2 ", 6},
        Layout{2, interleaved, "--pipeline-parallel 2 --virtual-stages 2 ", 3},
        // With the gradients and moments off the device and a KL term's reference stages.
        Layout{2, kFusedRun + "--offload --kl-coef 0.05 ", "--pipeline-parallel 2 ", 6},
        Layout{4, kFusedRun, "--tensor-parallel 2 --pipeline-parallel 2 ", 6},
        Layout{4, kFusedRun, "--pipeline-parallel 2 --expert-parallel 2 ", 6},
        Layout{8, kFusedRun, "--tensor-parallel 2 --pipeline-parallel 2 --expert-parallel 2 ",
               6}}) {
    SCOPED_TRACE(std::to_string(layout.ranks) + " ranks " + layout.options);
    const bool tp_pp = layout.options == "--tensor-parallel 2 --pipeline-parallel 2 ";
    const std::string dp_dir = temp_dir("pg-dp"), borrowing_dir = temp_dir("pg-borrowing"),
                      dir = temp_dir("pg");
    const std::string pipeline_run = layout.run + layout.options;
    const Result dp = test::run_rlfusion(layout.run + "--run-dir " + dp_dir, layout.ranks);
    const Result borrowing =
        test::run_rlfusion(pipeline_run + "--run-dir " + borrowing_dir, layout.ranks);
    const Result pp = test::run_rlfusion(
        pipeline_run + "--actor-pipeline-parallel 2 --run-dir " + dir, layout.ranks);
    for (const Result* run : {&dp, &borrowing, &pp}) ASSERT_EQ(run->exit_code, 0) << run->output;
    EXPECT_NE(pp.output.find("(--actor-pipeline-parallel 2), each stage from its own layers"),
              std::string::npos)
        << pp.output;
    EXPECT_NE(pp.output.find(", nothing borrowed per phase"), std::string::npos) << pp.output;
    test::expect_trains_like(dp, dp_dir, pp, dir, layout.steps);
    test::expect_trace_counts_tokens_like(dp_dir, borrowing_dir);
    test::expect_trace_counts_tokens_like(dp_dir, dir);
    test::expect_generation_peak_counted(pp.output, 0.85);
    EXPECT_LT(test::generation_peaks(pp.output).measured,
              test::generation_peaks(borrowing.output).measured)
        << pp.output << borrowing.output;
    // The groups' decode steps (summary.json), which the pipelines' messages follow: the same
    // samples in the same groups take the same steps, counted once per TP group.
    const double decode_steps = test::json_number(pp.output, "pipeline_decode_steps");
    EXPECT_GT(decode_steps, 0) << pp.output;
    if (layout.ranks == 2 && layout.steps == 6 && layout.options == "--pipeline-parallel 2 " &&
        layout.run == kFusedRun)
      two_stage_decode_steps = decode_steps;
    if (tp_pp) {
      EXPECT_EQ(decode_steps, two_stage_decode_steps) << pp.output;
    }
  }
  // PP 2 x EP 2 rebalancing every step under a skewed router, with a spare slot per rank: the
  // generation dispatchers follow every migration, so the samples and the model are the same run's
  // borrowing the other stage's layers.
  const std::string options = kFusedRun +
                              "--pipeline-parallel 2 --expert-parallel 2 --rebalance-every 1 "
                              "--router-skew 4 --redundant-experts 1 ";
  const std::string borrowing_dir = temp_dir("pg-rebalanced-borrowing"),
                    dir = temp_dir("pg-rebalanced");
  const Result borrowing = test::run_rlfusion(options + "--run-dir " + borrowing_dir, 4);
  const Result pp = test::run_rlfusion(options + "--actor-pipeline-parallel 2 --run-dir " + dir, 4);
  for (const Result* run : {&borrowing, &pp}) ASSERT_EQ(run->exit_code, 0) << run->output;
  EXPECT_NE(pp.output.find("# migration after step"), std::string::npos) << pp.output;
  // (The progress rows' step, reward, accuracy, response length and KL; the migration lines
  // between them aside.)
  EXPECT_EQ(test::progress_rows(pp.output, 5).size(), 6u) << pp.output;
  EXPECT_EQ(test::progress_rows(pp.output, 5), test::progress_rows(borrowing.output, 5))
      << pp.output;
  const std::vector<float> borrowing_model =
      test::read_tiny_parameters(borrowing_dir + "/model.h5");
  const std::vector<float> pp_model = test::read_tiny_parameters(dir + "/model.h5");
  EXPECT_LT(test::nmse(pp_model.data(), borrowing_model.data(), borrowing_model.size()), 1e-6);
}

// Stage balancing (--pipeline-balance) on the 4-layer `tiny` over PP 2: pinned at 3 + 1 layers
// (the head's stage holds one), by counted FLOPs and by measured times on 2 ranks, and pinned
// uneven cuts with EP 2 (3 + 1) and TP 2 (1 + 3) inside the stages on 4 ranks. Each cut trains
// like the data-parallel run (its rewards at every step and its saved model within float
// rounding: a layer trained on the wrong stage or lost at the boundary is off by far more), and the
// log and summary.json give the layers per chunk (what pins a measured cut) and each stage's
// compute time.
TEST(PipelineParallelTrain, BalancedStagesTrainLikeTheDataParallelFusedRun) {
  const std::string run = test::interleaved_fused_run(temp_dir("model-balance"));
  const std::string dp_dir = temp_dir("dp-balance");
  const Result dp = test::run_rlfusion(run + "--run-dir " + dp_dir, 2);
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  struct Cut {
    int ranks;
    std::string balance, options;
  };
  for (const Cut& cut :
       {Cut{2, "3,1", ""}, Cut{2, "counted", ""}, Cut{2, "measured", ""},
        Cut{4, "3,1", "--expert-parallel 2 "}, Cut{4, "1,3", "--tensor-parallel 2 "}}) {
    const std::string& balance = cut.balance;
    SCOPED_TRACE(balance + " " + cut.options);
    const std::string dir = temp_dir("pp-balance");
    const Result pp = test::run_rlfusion(run + "--pipeline-parallel 2 " + cut.options +
                                             "--pipeline-balance " + balance + " --run-dir " + dir,
                                         cut.ranks);
    ASSERT_EQ(pp.exit_code, 0) << pp.output;
    const size_t at = pp.output.find("\"pipeline_layers_per_chunk\":[");
    ASSERT_NE(at, std::string::npos) << pp.output;
    const std::string layers = pp.output.substr(at + 29, pp.output.find(']', at) - at - 29);
    // (Counted: 4 identical layers and a head of 32 words weigh 2 + 2.)
    const std::string want = balance == "counted" ? "2,2" : balance;
    if (balance != "measured") {
      EXPECT_EQ(layers, want);
    }
    EXPECT_NE(
        pp.output.find("layers per chunk " + layers + " (--pipeline-balance " + balance + ")"),
        std::string::npos)
        << pp.output;
    EXPECT_NE(pp.output.find("\"pipeline_balance\":\"" + balance + "\""), std::string::npos);
    EXPECT_NE(pp.output.find("\"pipeline_stage_compute_seconds\":["), std::string::npos);
    test::expect_trains_like(dp, dp_dir, pp, dir, 3);
  }
}

TEST(PipelineParallelTrain, ShapesThatDoNotFitStopEveryRankBeforeOutput) {
  test::expect_stops_before_output(
      {
          {2, "--pipeline-parallel 3", "--pipeline-parallel 3 must divide the world size 2"},
          {2, "--pipeline-parallel 2 --virtual-stages 2",
           "--pipeline-parallel 2 x --virtual-stages 2 = 4 model chunks must divide the "
           "model's 2 layers"},
          {2, "--pipeline-parallel 0", "--pipeline-parallel 0: must be a positive integer"},
          {2, "--pipeline-parallel 2 --micro-batches 40",
           "--micro-batches 40: a pipeline trains only 32 samples per step"},
          {2, "--virtual-stages 2",
           "--virtual-stages, --micro-batches and --pipeline-balance need --pipeline-parallel 2 "
           "or more"},
          {2, "--pipeline-balance counted",
           "--virtual-stages, --micro-batches and --pipeline-balance need --pipeline-parallel 2 "
           "or more"},
          {2, "--pipeline-parallel 2 --pipeline-balance 2",
           "--pipeline-balance '2': needs one layer count per model chunk (--pipeline-parallel x "
           "--virtual-stages = 2), got 1"},
          {2, "--pipeline-parallel 2 --pipeline-balance 2,0",
           "--pipeline-balance '2,0': every model chunk needs at least one layer"},
          {2, "--pipeline-parallel 2 --pipeline-balance 2,1",
           "--pipeline-balance 2,1: the chunks hold 3 layers, the model has 2"},
          {2, "--pipeline-parallel 2 --pipeline-balance fastest",
           "--pipeline-balance 'fastest': expected uniform, counted, measured or the layers of "
           "each model chunk"},
          {2, "--pipeline-parallel 2 --pipeline-balance 1,x",
           "--pipeline-balance '1,x': expected uniform, counted, measured"},
          {2,
           "--pipeline-parallel 2 --virtual-stages 2 --micro-batches 2 --pipeline-balance "
           "counted",
           "--pipeline-balance counted: --pipeline-parallel 2 x --virtual-stages 2 = 4 model "
           "chunks must not exceed the model's 2 layers"},
          {2, "--mode disaggregated --pipeline-parallel 2",
           "--pipeline-parallel 2 is not supported outside --mode fused"},
          // Generation inside the pipelines: at the pipelines' degree and the training TP and EP
          // degrees.
          {2, "--actor-pipeline-parallel 2",
           "--actor-pipeline-parallel 2 needs --mode fused and --pipeline-parallel 2 (generation "
           "inside the training pipelines; 1: data-parallel)"},
          {4, "--pipeline-parallel 2 --actor-pipeline-parallel 4",
           "--actor-pipeline-parallel 4 needs --mode fused and --pipeline-parallel 4"},
          {4,
           "--pipeline-parallel 2 --actor-pipeline-parallel 2 --expert-parallel 2 "
           "--actor-expert-parallel 1",
           "--actor-pipeline-parallel 2 with --actor-expert-parallel 1 is not supported: "
           "generation inside the pipelines runs each stage's own experts over its training EP "
           "group (--expert-parallel 2)"},
          // (With TP inside the stages, at the training TP degree only.)
          {4,
           "--pipeline-parallel 2 --tensor-parallel 2 --actor-pipeline-parallel 2 "
           "--actor-tensor-parallel 1",
           "--actor-pipeline-parallel 2 with --actor-tensor-parallel 1 is not supported: "
           "generation inside the pipelines runs each stage's own layers at the training TP "
           "degree (--tensor-parallel 2)"},
          {2, "--pipeline-parallel 2 --actor-pipeline-parallel 2 --actor-tensor-parallel 2",
           "--actor-pipeline-parallel 2 with --actor-tensor-parallel 2 is not supported: "
           "generation inside the pipelines runs each stage's own layers at the training TP "
           "degree (--tensor-parallel 1)"},
          {2, "--pipeline-parallel 2 --expert-parallel 2",
           "--pipeline-parallel 2 x --expert-parallel 2: the EP degree must divide the 1 "
           "pipelines"},
          // (A generation EP degree of its own: its groups must fit the pipelines.)
          {4, "--pipeline-parallel 2 --expert-parallel 2 --actor-expert-parallel 4",
           "--pipeline-parallel 2 x --actor-expert-parallel 4: the generation EP degree must "
           "divide the 2 pipelines (a generation EP group is a stage's ranks in 4 consecutive "
           "pipelines)"},
          {2, "--pipeline-parallel 2 --ep-overlap-chunks 2",
           "--pipeline-parallel 2 with --ep-overlap-chunks 2 needs --expert-parallel 2 or more"},
          {4, "--pipeline-parallel 2 --expert-parallel 2 --ep-overlap-chunks 0",
           "--ep-overlap-chunks must be >= 1, got 0"},
          {2, "--pipeline-parallel 2 --pipeline-pairing",
           "--pipeline-pairing needs --pipeline-parallel 2 or more and --expert-parallel 2 or "
           "more"},
          {2, "--expert-parallel 2 --pipeline-pairing",
           "--pipeline-pairing needs --pipeline-parallel 2 or more and --expert-parallel 2 or "
           "more"},
          {2, "--pipeline-parallel 2 --rebalance-every 1",
           "--rebalance-every needs --expert-parallel >= 2"},
          {4, "--pipeline-parallel 2 --tensor-parallel 2 --expert-parallel 2",
           "--pipeline-parallel 2 x --expert-parallel 2: the EP degree must divide the 1 model "
           "replicas (T x P ranks)"},
          {2, "--pipeline-parallel 2 --tensor-parallel 2",
           "--tensor-parallel 2 x --pipeline-parallel 2 = 4 ranks per model replica must divide "
           "the 2 ranks"},
          // (Interleaved StaleSync splits a pipeline's pieces into a multiple of p micro-batches:
          // whole groups of 4 samples cannot always make a multiple of 3.)
          {3, "--pipeline-parallel 3 --virtual-stages 2 --staleness 1",
           "--pipeline-parallel 3 with --staleness (StaleSync) is not supported with "
           "--virtual-stages 2 unless --group-size (4) is a multiple of --pipeline-parallel 3"},
          // Each rank's 4 prompts make no group for a fifth minibatch; 2 shares of 2 groups (16
          // samples over the pipeline) cannot fill 20 micro-batches.
          {2, "--pipeline-parallel 2 --minibatches 5",
           "--minibatches 5 with --micro-batches 0 (0: pieces of --micro-batch): a pipeline's "
           "smallest minibatch holds 0 samples"},
          {2, "--pipeline-parallel 2 --minibatches 2 --micro-batches 20",
           "--minibatches 2 with --micro-batches 20 (0: pieces of --micro-batch): a pipeline's "
           "smallest minibatch holds 16 samples, which cannot fill its 20 micro-batches"},
          {1, "--pipeline-parallel 2", "--pipeline-parallel 2 is not supported on one rank"},
      },
      temp_dir("bad"));
}

}  // namespace
}  // namespace rlf
