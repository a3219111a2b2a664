// EDPB inside `train` (docs/EDPB.md "Rebalancing in train"): expert-parallel learners of a
// skewed model that migrate experts every step train exactly like the same run that never
// migrates (the same per-step log rows and bit-identical final weights, actors fed by the
// expert-id weight sync, the KL reference moving along), in fused mode too (the generation layout
// switch finds the experts through the placement) and with the training experts in overlap
// chunks; router statistics and migrations land in the trace and the report; bad values are
// refused before any work.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/app/json_output.h"
#include "tests/app/progress_rows.h"
#include "tests/app/read_parameters.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

namespace fs = std::filesystem;
using test::CommandResult;

std::string temp_dir(const std::string& name) {
  const std::string dir =
      (fs::temp_directory_path() / ("rlfusion-rebalance-" + name + "-" + std::to_string(getpid())))
          .string();
  fs::remove_all(dir);
  return dir;
}

const std::string kSkewed =
    "train --model tiny --task sort --sft-steps 30 --sft-learning-rate 0.01 --steps 5 "
    "--prompts 4 --group-size 4 --eval-prompts 16 --kl-coef 0.01 --log-every 1 --json "
    "--router-skew 4 ";
const std::string kSkewedRun = kSkewed + "--learners 2 --actors 2 --expert-parallel 2 ";

// The progress rows' step, reward, accuracy, response length, KL and clip fraction (not the
// timing columns).
std::vector<std::string> step_rows(const std::string& output) {
  std::vector<std::string> rows;
  for (const std::vector<std::string>& fields : test::progress_rows(output)) {
    std::string row;
    for (const std::string& field : fields) row += field + " ";
    rows.push_back(row);
  }
  return rows;
}

// `run` on `ranks` ranks twice, never migrating and migrating after every step: it migrated (so
// the comparison can fail) and says so in the log and the summary, and both runs have the same
// per-step rows and bit-identical saved weights. Returns the two run directories.
std::pair<std::string, std::string> expect_migrating_run_trains_like_the_static_one(
    const std::string& name, const std::string& run, int ranks) {
  const std::string still_dir = temp_dir(name + "-still"), moved_dir = temp_dir(name + "-moved");
  const CommandResult still = test::run_rlfusion(run + "--run-dir " + still_dir, ranks);
  EXPECT_EQ(still.exit_code, 0) << still.output;
  const CommandResult moved = test::run_rlfusion(
      run + "--rebalance-every 1 --rebalance-min-gain 0 --run-dir " + moved_dir, ranks);
  EXPECT_EQ(moved.exit_code, 0) << moved.output;
  EXPECT_NE(moved.output.find("# migration after step"), std::string::npos) << moved.output;
  EXPECT_GT(test::json_number(moved.output, "migrations"), 0) << moved.output;
  EXPECT_EQ(test::json_number(still.output, "migrations"), 0);
  EXPECT_EQ(test::json_number(moved.output, "router_skew"), 4);
  const std::vector<std::string> still_rows = step_rows(still.output);
  EXPECT_EQ(still_rows.size(), 5u) << still.output;
  EXPECT_EQ(step_rows(moved.output), still_rows);
  EXPECT_EQ(test::read_saved_parameters(moved_dir + "/model.h5"),
            test::read_saved_parameters(still_dir + "/model.h5"));
  return {still_dir, moved_dir};
}

TEST(TrainRebalance, MigratingLearnersTrainLikeTheRunThatNeverMigrates) {
  const auto [still_dir, moved_dir] =
      expect_migrating_run_trains_like_the_static_one("disaggregated", kSkewedRun, 4);
  // The report shows both runs' router statistics, and the moved run's migrations.
  const CommandResult report = test::run_rlfusion("report " + moved_dir);
  ASSERT_EQ(report.exit_code, 0) << report.output;
  EXPECT_NE(report.output.find("# expert load per layer"), std::string::npos) << report.output;
  EXPECT_NE(report.output.find("# expert migrations"), std::string::npos) << report.output;
  EXPECT_NE(report.output.find("job.router_max_over_mean = "), std::string::npos) << report.output;
  EXPECT_NE(report.output.find("job.expert_moves_per_step = "), std::string::npos) << report.output;
  const CommandResult json = test::run_rlfusion("report " + still_dir + " --json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  // The planner's input: the layers' max/mean averaged (2 layers).
  const size_t first = json.output.find("\"router_layers\":[");
  ASSERT_NE(first, std::string::npos) << json.output;
  const size_t second = json.output.find("\"layer\":1", first);
  ASSERT_NE(second, std::string::npos) << json.output;
  EXPECT_NEAR(test::json_number(json.output, "router_max_over_mean"),
              (test::json_number(json.output, "max_over_mean", first) +
               test::json_number(json.output, "max_over_mean", second)) /
                  2,
              1e-6)
      << json.output;
  // Skewed routing: layer 0's busiest expert well above the mean, over all 5 steps.
  const size_t layers = json.output.find("\"router_layers\":[");
  ASSERT_NE(layers, std::string::npos) << json.output;
  EXPECT_GT(test::json_number(json.output, "max_over_mean", layers), 1.2) << json.output;
  EXPECT_EQ(test::json_number(json.output, "steps", layers), 5) << json.output;
  EXPECT_NE(json.output.find("\"migrations\":[]"), std::string::npos) << json.output;
  // The recorded routing, exported and replayed by bench balance; a layer the trace lacks stops.
  const std::string routing = still_dir + "/routing_layer1.csv";
  const CommandResult exported = test::run_rlfusion("report " + still_dir + " --routing-trace " +
                                                    routing + " --routing-layer 1");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_NE(exported.output.find("(layer 1, 5 steps x 4 experts)"), std::string::npos)
      << exported.output;
  const CommandResult replay =
      test::run_rlfusion("bench balance --cost-model 1e-4,4e-6,2e-8 --routing-trace " + routing +
                         " --nodes 1 --devices-per-node 2 --eplb-groups 2");
  EXPECT_EQ(replay.exit_code, 0) << replay.output;
  EXPECT_NE(replay.output.find(routing), std::string::npos) << replay.output;
  const CommandResult missing = test::run_rlfusion("report " + still_dir + " --routing-trace " +
                                                   routing + ".x --routing-layer 9");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("router statistics for layers 0, 1"), std::string::npos)
      << missing.output;
  EXPECT_FALSE(fs::exists(routing + ".x"));
}

// Fused mode: training at EP 2 and generation through the layout switch at EP 1 (2 ranks: each
// rank receives the experts its training EP rank lacks, wherever the rebalancer put them) and at
// EP 4 (4 ranks, 2 replicas, training in overlap chunks: which ranks receive which expert changes
// with the placement).
TEST(TrainRebalance, FusedRanksMigratingTrainLikeTheRunThatNeverMigrates) {
  expect_migrating_run_trains_like_the_static_one(
      "fused-switch-1", kSkewed + "--mode fused --expert-parallel 2 --actor-expert-parallel 1 ", 2);
  expect_migrating_run_trains_like_the_static_one(
      "fused-switch-4",
      kSkewed + "--mode fused --expert-parallel 2 --actor-expert-parallel 4 --ep-overlap-chunks 2 ",
      4);
}

// kSkewed on the tiny model with 8 experts (every EP rank of EP 4 holds 2, so a permutation can
// move them), the model written to a temporary file named after `name`.
std::string skewed_with_eight_experts(const std::string& name) {
  const std::string model = temp_dir(name) + ".ini";
  std::ifstream tiny(std::string(RLFUSION_SOURCE_DIR) + "/inputs/models/tiny.ini");
  std::ofstream out(model);
  std::string line;
  while (std::getline(tiny, line))
    out << (line.rfind("n_experts", 0) == 0 ? "n_experts = 8" : line) << "\n";
  return std::string(kSkewed).replace(kSkewed.find("--model tiny"), 12, "--model " + model);
}

std::string log_of(const std::string& run_dir) {
  std::ifstream log(run_dir + "/log.txt");
  return std::string((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
}

// EP 4 over 2 virtual nodes of 2 ranks (fused, 4 ranks): the rebalancer plans on the two nodes,
// moves between them charged the emulated inter-node link, and training stays bit-identical.
TEST(TrainRebalance, TwoVirtualNodesMigratingTrainLikeTheRunThatNeverMigrates) {
  const std::string run = skewed_with_eight_experts("tiny8-nodes") +
                          "--mode fused --expert-parallel 4 --ranks-per-node 2 "
                          "--inter-node-bandwidth 1e9 ";
  const auto [still_dir, moved_dir] =
      expect_migrating_run_trains_like_the_static_one("two-nodes", run, 4);
  const std::string text = log_of(moved_dir);
  EXPECT_NE(text.find("planned as 2 node(s) x 2 EP ranks"), std::string::npos) << text;
}

// Fused mode with a generation layout of its own (training EP 4, generation EP 2 on 4 ranks;
// training EP 2, generation EP 4): with rebalancing, generation's experts are placed by the
// predicted loads too, the switch fetching each from wherever training holds it; the rows and
// the saved weights equal the run that never rebalances.
TEST(TrainRebalance, FusedGenerationPlacementTrainsLikeTheRunThatNeverRebalances) {
  for (const std::string degrees : {"--expert-parallel 4 --actor-expert-parallel 2 ",
                                    "--expert-parallel 2 --actor-expert-parallel 4 "}) {
    SCOPED_TRACE(degrees);
    const std::string name = degrees.find("parallel 4 --") != std::string::npos ? "4-2" : "2-4";
    const auto [still_dir, moved_dir] = expect_migrating_run_trains_like_the_static_one(
        "generation-placement-" + name,
        skewed_with_eight_experts("tiny8-" + name) + "--mode fused " + degrees, 4);
    const std::string text = log_of(moved_dir);
    EXPECT_NE(text.find("# generation placement after step 1:"), std::string::npos) << text;
    EXPECT_EQ(log_of(still_dir).find("# generation placement"), std::string::npos);
  }
}

// Training's experts in overlap chunks (every chunk's dispatcher follows the migrations): fused
// with generation on the training layout (2 ranks), disaggregated learners (4 ranks).
TEST(TrainRebalance, OverlapChunksMigratingTrainLikeTheRunThatNeverMigrates) {
  expect_migrating_run_trains_like_the_static_one(
      "fused-chunks", kSkewed + "--mode fused --expert-parallel 2 --ep-overlap-chunks 2 ", 2);
  expect_migrating_run_trains_like_the_static_one("disaggregated-chunks",
                                                  kSkewedRun + "--ep-overlap-chunks 3 ", 4);
}

// The router statistics `report` shows for a 5-step run of `samples` samples a step saved in
// `dir` (the 2-layer `tiny`, top_k 2): every layer counts each trained input token top_k times.
void expect_router_statistics_count_every_input_token(const std::string& dir, int samples) {
  const CommandResult still = test::run_rlfusion("report " + dir + " --json");
  ASSERT_EQ(still.exit_code, 0) << still.output;
  const CommandResult run_summary = test::run_rlfusion("report " + dir);
  ASSERT_EQ(run_summary.exit_code, 0) << run_summary.output;
  EXPECT_NE(run_summary.output.find("# expert load per layer"), std::string::npos)
      << run_summary.output;
  // The trained input tokens: every sample's prompt and response less its last token, over 5
  // steps. The summary gives the trained tokens (prompt + response) as rl_tokens_per_s x
  // rl_seconds, printed to 0.1 and 0.001: `rounding` bounds the product's error. Generation's
  // forwards counted too, a micro-batch chunk's dispatchers left out, or a TP group's tokens
  // counted on each of its ranks, would be off by a large share of the tokens.
  std::ifstream summary_file(dir + "/summary.json");
  const std::string summary((std::istreambuf_iterator<char>(summary_file)),
                            std::istreambuf_iterator<char>());
  const double per_second = test::json_number(summary, "rl_tokens_per_s");
  const double seconds = test::json_number(summary, "rl_seconds");
  const double inputs = per_second * seconds - 5.0 * samples;
  const double rounding = 0.05 * seconds + 0.0005 * per_second + 0.01;
  ASSERT_GT(inputs, 20 * rounding) << summary;
  std::vector<double> assignments;
  for (const int layer : {0, 1}) {
    const size_t at = still.output.find("{\"layer\":" + std::to_string(layer) + ",");
    ASSERT_NE(at, std::string::npos) << "no router statistics for layer " << layer << still.output;
    EXPECT_EQ(test::json_number(still.output, "steps", at), 5) << still.output;
    assignments.push_back(test::json_number(still.output, "assignments", at));
    EXPECT_NEAR(assignments.back(), 2 * inputs, 2 * rounding)
        << "layer " << layer << ": " << still.output;
  }
  // Every token passes both layers: exactly as many assignments.
  EXPECT_EQ(assignments[0], assignments[1]);
}

// PP 2 x EP 2 on 4 ranks: each stage's EP groups move the experts of its own layer (with their
// AdamW moments and KL reference) in every micro-batch chunk's dispatchers and the generation
// model's, and training stays bit-identical. Each stage records its layer's router statistics
// from its micro-batch chunks' dispatchers (training's forwards): summed over the ranks, every
// layer counts each trained input token top_k (2) times.
TEST(TrainRebalance, PipelineStagesMigratingTrainLikeTheRunThatNeverMigrates) {
  const auto [still_dir, moved_dir] = expect_migrating_run_trains_like_the_static_one(
      "pipeline-experts", kSkewed + "--mode fused --pipeline-parallel 2 --expert-parallel 2 ", 4);
  expect_router_statistics_count_every_input_token(still_dir, 16);
}

// TP 2 x EP 2 x PP 2 on 8 ranks: every TP rank's EP groups of a stage move the same experts of
// that stage's layer; the same rows and bit-identical weights. With the token split each TP rank
// counts the rows it dispatched: every layer still counts each trained input token top_k times.
TEST(TrainRebalance, TensorPipelineExpertGroupsMigratingTrainLikeTheRunThatNeverMigrates) {
  // (8 prompts: a block for each of the 8 generating ranks)
  std::string run = kSkewed;
  run.replace(run.find("--prompts 4"), 11, "--prompts 8");
  const auto [still_dir, moved_dir] = expect_migrating_run_trains_like_the_static_one(
      "tensor-pipeline-experts",
      run + "--mode fused --tensor-parallel 2 --pipeline-parallel 2 --expert-parallel 2 ", 8);
  expect_router_statistics_count_every_input_token(still_dir, 32);
}

// TP 2 x EP 2 on 4 ranks: both TP ranks' EP groups move the same experts (the TP group's ranks
// hold the same ones), with the token split (each TP rank dispatching its share of the rows) and
// with every TP rank dispatching all of them, each also with training's experts in 2 overlap
// chunks (every chunk's dispatcher follows the migrations); the same rows and bit-identical
// weights.
TEST(TrainRebalance, TensorParallelGroupsMigratingTrainLikeTheRunThatNeverMigrates) {
  struct Variant {
    std::string name, options;
  };
  for (const Variant& v : {Variant{"tensor-split", ""},
                           Variant{"tensor-duplicate", "--tensor-parallel-duplicate-experts "},
                           Variant{"tensor-split-chunks", "--ep-overlap-chunks 2 "},
                           Variant{"tensor-duplicate-chunks",
                                   "--tensor-parallel-duplicate-experts --ep-overlap-chunks 2 "},
                           // Generation data-parallel from the regrouped dense model with the
                           // rank's (migrated) experts.
                           Variant{"tensor-dp-generation", "--actor-tensor-parallel 1 "}}) {
    SCOPED_TRACE(v.name);
    expect_migrating_run_trains_like_the_static_one(
        v.name, kSkewed + "--mode fused --tensor-parallel 2 --expert-parallel 2 " + v.options, 4);
  }
}

// bench rebalance's correctness verdict and load figures (never its times): the static run's
// hot experts share EP rank 0, the rebalanced one moves them and ends with the same weights.
// Also fused (generation before each step, on the migrated placement) with overlap chunks.
TEST(TrainRebalance, BenchMigratesAndKeepsTheWeights) {
  for (const std::string mode : {"", "--mode fused --generate-tokens 8 --ep-overlap-chunks 2 "}) {
    const CommandResult r = test::run_rlfusion(
        "bench rebalance --model tiny --steps 6 --length 24 --rebalance-min-gain 0 --threads 1 "
        "--json " +
            mode,
        2);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("Final weights bit-identical            : OK"), std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("FAIL"), std::string::npos) << r.output;
    EXPECT_EQ(test::json_number(r.output, "bit_identical"), 1);
    EXPECT_GT(test::json_number(r.output, "migrations"), 0);
    EXPECT_LT(test::json_number(r.output, "rebalanced_load_max_over_mean"),
              test::json_number(r.output, "static_load_max_over_mean"))
        << r.output;
  }
}

TEST(TrainRebalance, BadValuesAreRefusedBeforeAnyWork) {
  const std::string dir = temp_dir("bad");
  const std::string run = "train --model tiny --task sort --steps 2 --run-dir " + dir + " ";
  const std::string kEp = "--learners 2 --actors 2 --expert-parallel 2 ";
  const std::vector<std::tuple<std::string, int, std::string>> cases = {
      {"--rebalance-every -1", 0, "--rebalance-every"},
      {"--rebalance-every 2", 0, "--expert-parallel >= 2"},
      {"--rebalance-horizon 0", 0, "--rebalance-horizon"},
      {"--router-skew -1", 0, "--router-skew"},
      {"--mode fused --rebalance-every 2", 2, "--expert-parallel >= 2"},
      // Replicas (--redundant-experts): the range.
      {"--redundant-experts -1", 0, "--redundant-experts must be >= 0"},
      {"--redundant-experts 1", 0, "--redundant-experts needs --expert-parallel >= 2"},
      {kEp + "--redundant-experts 3", 4, "--redundant-experts"},
      {"--mode fused --expert-parallel 2 --redundant-experts 4", 2, "--redundant-experts"},
      // The rates the decisions charge: a known kind, a readable and valid cluster file,
      // which gives counted rates only.
      {"--rebalance-rates timed", 0, "--rebalance-rates must be counted or measured"},
      {"--rebalance-cluster " + dir + "-missing.ini", 0, "cannot be read"},
      {"--rebalance-cluster cloudmatrix-384 --rebalance-rates measured", 0,
       "--rebalance-cluster gives counted rates"},
      {kEp + "--rebalance-every 1 --rebalance-cluster " + dir + "-missing.ini", 4,
       "cannot be read"}};
  std::vector<test::RlfusionRun> runs;
  for (const auto& [args, ranks, option] : cases) runs.push_back({run + args, ranks});
  const std::vector<CommandResult> results = test::run_rlfusion_concurrently(runs);
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [args, ranks, option] = cases[i];
    const CommandResult& r = results[i];
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(option), std::string::npos) << args << "\n" << r.output;
  }
  EXPECT_FALSE(fs::exists(dir));
}

}  // namespace
}  // namespace rlf
