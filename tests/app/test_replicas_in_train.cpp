// Replicas of hot experts inside `train` (`--redundant-experts R`, docs/EDPB.md): EP ranks of a
// skewed model with one spare slot per EP rank, rebalancing after every step, end with replicated
// experts (summary.json counts them) and train like the same run without replicas or rebalancing:
// the same per-step rows and model.h5 within float rounding (the replicas' gradient sum adds in
// another order, so not bit for bit; the saved model holds each expert once, from its first
// replica). Disaggregated learners, fused ranks (generation on the training layout, or through the
// layout switch taking one copy of each expert) and training's experts in overlap chunks. What
// replicas do not support is refused with exit code 2 before any work, naming the option
// (TrainRebalance.BadValuesAreRefusedBeforeAnyWork).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/app/fused_train_runs.h"
#include "tests/app/json_output.h"
#include "tests/app/progress_rows.h"
#include "tests/app/read_parameters.h"
#include "tests/app/run_rlfusion.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

using test::CommandResult;

std::string temp_dir(const std::string& name) {
  return test::fresh_temp_dir("replicas-" + name + "-" + std::to_string(getpid()));
}

const std::string kSkewed =
    "train --model tiny --task sort --sft-steps 30 --sft-learning-rate 0.01 --steps 5 "
    "--prompts 4 --group-size 4 --eval-prompts 16 --kl-coef 0.01 --log-every 1 --json "
    "--router-skew 4 ";
const std::string kSkewedRun = kSkewed + "--learners 2 --actors 2 --expert-parallel 2 ";
const std::string kSkewedFused = kSkewed + "--mode fused --expert-parallel 2 ";

// The progress rows' step, reward, accuracy, response length, KL and clip fraction, as numbers.
std::vector<std::vector<double>> step_rows(const std::string& output) {
  std::vector<std::vector<double>> rows;
  for (const std::vector<std::string>& fields : test::progress_rows(output)) {
    rows.emplace_back();
    for (const std::string& field : fields) rows.back().push_back(std::stod(field));
  }
  return rows;
}

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// `run` on `ranks` ranks with R = 0 and no rebalancing, and with R = 1 rebalancing after every
// step: the second replicated (so the comparisons can fail) and trained like the first.
void expect_replicas_train_like_the_single_copy(const std::string& name, const std::string& run,
                                                int ranks) {
  SCOPED_TRACE(name);
  const std::string single_dir = temp_dir(name + "-single"),
                    replica_dir = temp_dir(name + "-replicas");
  const CommandResult single = test::run_rlfusion(run + "--run-dir " + single_dir, ranks);
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const CommandResult replicas = test::run_rlfusion(
      run + "--redundant-experts 1 --rebalance-every 1 --rebalance-min-gain 0 --run-dir " +
          replica_dir,
      ranks);
  ASSERT_EQ(replicas.exit_code, 0) << replicas.output;
  // It replicated (so the comparisons below can fail): counted in summary.json.
  const std::string summary = file_text(replica_dir + "/summary.json");
  EXPECT_EQ(test::json_number(summary, "redundant_experts"), 1) << summary;
  EXPECT_GT(test::json_number(summary, "replicated_experts"), 0) << summary;
  EXPECT_GT(test::json_number(summary, "migrations"), 0) << summary;
  EXPECT_EQ(test::json_number(file_text(single_dir + "/summary.json"), "replicated_experts"), 0);
  // Per-step reward, accuracy, response length, KL and clip fraction: the printed figures agree
  // within 1e-3 (relative, or absolute near 0); float rounding of the weights could only flip a
  // sampled token whose uniform draw lies within rounding of a CDF boundary.
  const std::vector<std::vector<double>> a = step_rows(single.output),
                                         b = step_rows(replicas.output);
  ASSERT_EQ(a.size(), 5u) << single.output;
  ASSERT_EQ(b.size(), a.size()) << replicas.output;
  for (size_t s = 0; s < a.size(); ++s) {
    ASSERT_EQ(a[s].size(), b[s].size());
    for (size_t i = 0; i < a[s].size(); ++i)
      EXPECT_NEAR(b[s][i], a[s][i], 1e-3 * std::max(1.0, std::fabs(a[s][i])))
          << "step row " << s + 1 << " column " << i;
  }
  // model.h5 (each expert once, from its first replica) within float rounding: normalized squared
  // error below 1e-6 (AdamW turns a rounding-level gradient into a step of the learning rate, so a
  // single weight may differ by a few such steps; a wrong or stale replica is off by orders more).
  const std::vector<float> x = test::read_tiny_parameters(single_dir + "/model.h5");
  const std::vector<float> y = test::read_tiny_parameters(replica_dir + "/model.h5");
  ASSERT_EQ(x.size(), y.size());
  const double error = test::nmse(y.data(), x.data(), x.size());
  EXPECT_LT(error, 1e-6);
  EXPECT_GT(error, 0.0) << "bit-identical: were the replicas' gradients summed at all?";
}

// Overlap chunks with replicas: `run` with one spare slot per EP rank and rebalancing after every
// step, 3 steps, with training's experts in 2 overlap chunks and without: replicated, and the
// models within 1e-7 (measured 3e-9 at PP 2 x EP 2; the chunks sum the expert gradients in another
// order, and over 5 steps that can flip a sampled token, which the row comparison of
// expect_replicas_train_like_the_single_copy would see).
void expect_chunks_with_replicas_train_like_without(const std::string& name, std::string run,
                                                    int ranks) {
  SCOPED_TRACE(name + " with overlap chunks");
  run.replace(run.find("--steps 5"), 9, "--steps 3");
  run += "--redundant-experts 1 --rebalance-every 1 --rebalance-min-gain 0 ";
  const std::string plain_dir = temp_dir(name + "-plain"), chunks_dir = temp_dir(name + "-chunks");
  const CommandResult plain = test::run_rlfusion(run + "--run-dir " + plain_dir, ranks);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const CommandResult chunks =
      test::run_rlfusion(run + "--ep-overlap-chunks 2 --run-dir " + chunks_dir, ranks);
  ASSERT_EQ(chunks.exit_code, 0) << chunks.output;
  EXPECT_NE(chunks.output.find("training's experts in 2 overlap chunk(s)"), std::string::npos)
      << chunks.output;
  EXPECT_GT(test::json_number(file_text(chunks_dir + "/summary.json"), "replicated_experts"), 0);
  const std::vector<float> x = test::read_tiny_parameters(plain_dir + "/model.h5");
  const std::vector<float> y = test::read_tiny_parameters(chunks_dir + "/model.h5");
  ASSERT_EQ(x.size(), y.size());
  EXPECT_LT(test::nmse(y.data(), x.data(), x.size()), 1e-7);
}

TEST(TrainReplicas, ReplicatingLearnersTrainLikeTheSingleCopyRun) {
  expect_replicas_train_like_the_single_copy("disaggregated", kSkewedRun, 4);
  // TP 2 x EP 2 learners (4) with 2 actors: every TP rank's EP group migrates and replicates the
  // same experts; TP rank 0 of each TP group sends its slots' experts to the actors.
  expect_replicas_train_like_the_single_copy(
      "disaggregated-tensor",
      kSkewed + "--learners 4 --actors 2 --expert-parallel 2 --tensor-parallel 2 ", 6);
}

// Fused ranks: generation on the training layout (its dispatchers split a replicated expert's
// tokens too), and through the layout switch to generation EP 1 (each rank takes one copy of
// every expert, its own replica where it holds one).
TEST(TrainReplicas, FusedRanksWithReplicasTrainLikeTheSingleCopyRun) {
  expect_replicas_train_like_the_single_copy("fused", kSkewedFused, 2);
  expect_replicas_train_like_the_single_copy("fused-switch-1",
                                             kSkewedFused + "--actor-expert-parallel 1 ", 2);
}

// Training's experts in overlap chunks: every chunk's dispatcher splits its replicated experts'
// tokens and follows the migrations (fused ranks, and disaggregated learners).
TEST(TrainReplicas, OverlapChunksWithReplicasTrainLikeTheSingleCopyRun) {
  expect_replicas_train_like_the_single_copy("fused-chunks",
                                             kSkewedFused + "--ep-overlap-chunks 2 ", 2);
  expect_replicas_train_like_the_single_copy("disaggregated-chunks",
                                             kSkewedRun + "--ep-overlap-chunks 2 ", 4);
}

// TP 2 x EP 2 on 4 ranks: every TP rank's EP group holds the same slot tables (the same decisions
// from the world's loads), a TP group's ranks the same replicas; the split's TP sum of expert
// gradients covers the spare slots too. With the token split, duplicated, and generating at TP 1
// (each rank's regrouped generation model keeps its training slots, spare ones included, and
// generates over its training EP group); in 2 overlap chunks against the same replicas without
// them (5 steps against the single copy flipped a sampled token at step 4 on an AMD EPYC host,
// 2026-12-04).
TEST(TrainReplicas, TensorParallelGroupsWithReplicasTrainLikeTheSingleCopyRun) {
  const std::string tensor = kSkewedFused + "--tensor-parallel 2 ";
  expect_replicas_train_like_the_single_copy("tensor-split", tensor, 4);
  expect_replicas_train_like_the_single_copy("tensor-generation-tp-1",
                                             tensor + "--actor-tensor-parallel 1 ", 4);
  expect_replicas_train_like_the_single_copy("tensor-duplicate",
                                             tensor + "--tensor-parallel-duplicate-experts ", 4);
  expect_chunks_with_replicas_train_like_without("tensor", tensor, 4);
}

// PP 2 x EP 2 on 4 ranks: every stage stores its experts in E / 2 + 1 slots, its views' dispatchers
// split a replicated expert's tokens, every stage's EP group migrates and replicates its own
// layers' experts, and generation runs on the gathered slot layout (or through the layout switch
// to EP 1); with pairing and with StaleSync too, and TP 2 x EP 2 x PP 2 on 8 ranks (generating at
// TP 1 and at TP 2); in overlap chunks against the same replicas without them.
TEST(TrainReplicas, PipelineStagesWithReplicasTrainLikeTheSingleCopyRun) {
  const std::string pipeline = kSkewedFused + "--pipeline-parallel 2 ";
  expect_replicas_train_like_the_single_copy("pipeline", pipeline, 4);
  expect_replicas_train_like_the_single_copy("pipeline-switch-1",
                                             pipeline + "--actor-expert-parallel 1 ", 4);
  expect_replicas_train_like_the_single_copy("pipeline-pairing", pipeline + "--pipeline-pairing ",
                                             4);
  expect_replicas_train_like_the_single_copy("pipeline-stalesync", pipeline + "--staleness 1 ", 4);
  std::string eight_ranks = pipeline + "--tensor-parallel 2 ";
  eight_ranks.replace(eight_ranks.find("--prompts 4"), 11, "--prompts 8");
  expect_replicas_train_like_the_single_copy("tensor-expert-pipeline", eight_ranks, 8);
  // Generating at TP 2, not the pipelines' default TP 1: each rank's generation slice of every
  // layer keeps the pipeline's slots, spare ones included.
  expect_replicas_train_like_the_single_copy("tensor-expert-pipeline-generation-tp-2",
                                             eight_ranks + "--actor-tensor-parallel 2 ", 8);
  expect_chunks_with_replicas_train_like_without("pipeline", pipeline, 4);
}

// Reproducible decisions (--rebalance-rates counted, the default): two runs with one seed,
// replicas and rebalancing after every step at the default threshold (where a timed rate could
// tip a decision), migrate alike and end bit for bit alike: the same per-step rows (printed
// figures), the same migration lines, the same model.h5.
void expect_same_seed_same_run(const std::string& name, const std::string& run, int ranks) {
  SCOPED_TRACE(name);
  const std::string args = run + "--redundant-experts 1 --rebalance-every 1 ";
  const std::string first_dir = temp_dir(name + "-first"), second_dir = temp_dir(name + "-second");
  const CommandResult first = test::run_rlfusion(args + "--run-dir " + first_dir, ranks);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const CommandResult second = test::run_rlfusion(args + "--run-dir " + second_dir, ranks);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(first.output.find("over the counted link"), std::string::npos) << first.output;
  EXPECT_GT(test::json_number(file_text(first_dir + "/summary.json"), "migrations"), 0)
      << first.output;
  EXPECT_EQ(test::progress_rows(first.output), test::progress_rows(second.output));
  auto migration_lines = [](const std::string& output) {
    std::vector<std::string> lines;
    std::istringstream in(output);
    for (std::string line; std::getline(in, line);)
      if (line.starts_with("# migration after step")) lines.push_back(line);
    return lines;
  };
  EXPECT_EQ(migration_lines(first.output), migration_lines(second.output));
  EXPECT_EQ(test::read_tiny_parameters(first_dir + "/model.h5"),
            test::read_tiny_parameters(second_dir + "/model.h5"));
}

TEST(TrainReplicas, SameSeedRebalancesAlikeAndEndsBitIdentical) {
  expect_same_seed_same_run("same-seed-disaggregated", kSkewedRun, 4);
  expect_same_seed_same_run("same-seed-fused", kSkewedFused, 2);
}

// bench rebalance's third run: one spare slot per rank, the rebalancer replicating; its load and
// weight verdicts (never its times).
TEST(TrainReplicas, BenchRebalanceWithReplicasPrintsTheThreeRuns) {
  const CommandResult r = test::run_rlfusion(
      "bench rebalance --model tiny --steps 6 --length 24 --rebalance-min-gain 0 --threads 1 "
      "--redundant-experts 1 --json",
      2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("FAIL"), std::string::npos) << r.output;
  EXPECT_EQ(test::json_number(r.output, "bit_identical"), 1);
  EXPECT_EQ(test::json_number(r.output, "redundant_experts"), 1);
  EXPECT_GT(test::json_number(r.output, "replicas_migrations"), 0) << r.output;
  EXPECT_GT(test::json_number(r.output, "replicated_experts"), 0) << r.output;
  // The weights are compared only while both runs route alike; here they do, so the check ran.
  EXPECT_EQ(test::json_number(r.output, "replicas_routing_parted_step"), 0) << r.output;
  EXPECT_LE(test::json_number(r.output, "replicas_weight_error"), 1e-4) << r.output;
}

}  // namespace
}  // namespace rlf
