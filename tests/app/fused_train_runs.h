// What the model-parallel `train --mode fused` app tests (tensor and pipeline parallelism) share:
// the run they compare with the data-parallel fused run, its per-step table, and the check that a
// bad option stops every rank before any output.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/app/json_output.h"
#include "tests/app/read_parameters.h"
#include "tests/app/run_rlfusion.h"
#include "tests/test_util.h"

namespace rlf::test {

// `tiny` on `sort`: 100 SFT steps, then 6 RL steps of 8 prompts x 4 samples, logged every step.
inline const std::string kModelParallelRun =
    "train --model tiny --task sort --sft-steps 100 --sft-learning-rate 0.01 --steps 6 "
    "--prompts 8 --group-size 4 --eval-prompts 32 --log-every 1 --json ";
inline const std::string kModelParallelFusedRun = kModelParallelRun + "--mode fused ";

// An empty directory name under the system's temporary folder. The running test's name is part
// of it: ctest runs tests in parallel, and two tests asking for the same name must not share (and
// delete) each other's run directory.
inline std::string fresh_temp_dir(const std::string& name) {
  std::string owner;
  if (const auto* test = ::testing::UnitTest::GetInstance()->current_test_info())
    owner = std::string(test->test_suite_name()) + "." + test->name() + "-";
  for (char& c : owner)
    if (c == '/') c = '_';  // parameterised tests' names hold '/'
  const auto dir = std::filesystem::temp_directory_path() / ("rlfusion-" + owner + name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

// The per-step table's rows ("  step reward acc resp-len kl ..."): up to the KL column.
inline std::vector<std::string> step_rewards(const std::string& output) {
  std::vector<std::string> rows;
  const size_t header = output.find("#   step   reward");
  if (header == std::string::npos) return rows;
  size_t line_start = output.find('\n', header);
  while (line_start != std::string::npos) {
    ++line_start;
    const size_t line_end = output.find('\n', line_start);
    const std::string line = output.substr(line_start, line_end - line_start);
    if (line.empty() || line[0] == '#') break;
    rows.push_back(line.substr(0, 44));  // step, reward, acc, resp-len, kl
    line_start = line_end;
  }
  return rows;
}

struct BadOptions {
  int ranks;
  std::string options, message;
};

// Each of `bad` (added to the fused run, or to the disaggregated one when it names --mode) stops
// every rank with exit code 2 and its message, before the run directory `dir` exists. The runs
// stop before any work, so they run a few at once (run_rlfusion_concurrently).
inline void expect_stops_before_output(const std::vector<BadOptions>& bad, const std::string& dir) {
  std::vector<RlfusionRun> runs;
  for (const BadOptions& b : bad) {
    const bool fused = b.options.find("--mode") == std::string::npos;
    runs.push_back(
        {(fused ? kModelParallelFusedRun : kModelParallelRun) + b.options + " --run-dir " + dir,
         b.ranks});
  }
  const std::vector<CommandResult> results = run_rlfusion_concurrently(runs);
  for (size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE(bad[i].options);
    EXPECT_EQ(results[i].exit_code, 2) << results[i].output;
    EXPECT_NE(results[i].output.find(bad[i].message), std::string::npos) << results[i].output;
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// A 4-layer `tiny` written into `model_dir` (2 stages can hold 2 chunks each, or uneven chunks);
// returns the model file's path.
inline std::string write_tiny4_model(const std::string& model_dir) {
  std::filesystem::create_directories(model_dir);
  const std::string model = model_dir + "/tiny4.ini";
  std::ofstream out(model);
  out << "[model]\nname = tiny4\nvocab_size = 32\nd_model = 32\nn_layers = 4\nn_heads = 4\n"
         "n_experts = 4\ntop_k = 2\nd_ff = 32\nshared_expert_d_ff = 16\nmax_seq_len = 128\n";
  return model;
}

// The run the interleaved-schedule tests compare: the 4-layer `tiny` (write_tiny4_model) on
// `sort`, 60 SFT steps, 3 RL steps of 8 prompts x 4 samples in micro-batches of 4, fused.
inline std::string interleaved_fused_run(const std::string& model_dir) {
  return "train --model " + write_tiny4_model(model_dir) +
         " --task sort --sft-steps 60 --sft-learning-rate 0.01 --steps 3 --prompts 8 "
         "--group-size 4 --eval-prompts 16 --log-every 1 --json --mode fused --micro-batch 4 ";
}

// `run` (saved into `dir`) trained like the data-parallel run `dp` (saved into `dp_dir`): its
// `steps` per-step rows and a saved model within float rounding (normalized squared error below
// 1e-6: a misplaced layer or slice, or a stage that trained other data, is off by many orders
// more).
inline void expect_trains_like(const CommandResult& dp, const std::string& dp_dir,
                               const CommandResult& run, const std::string& dir, size_t steps) {
  const std::vector<std::string> want = step_rewards(dp.output);
  ASSERT_EQ(want.size(), steps) << dp.output;
  EXPECT_EQ(step_rewards(run.output), want) << run.output;
  const std::vector<float> dp_model = read_saved_parameters(dp_dir + "/model.h5");
  const std::vector<float> model = read_saved_parameters(dir + "/model.h5");
  ASSERT_EQ(model.size(), dp_model.size());
  EXPECT_LT(nmse(model.data(), dp_model.data(), dp_model.size()), 1e-6);
}

// `report --json` of the run in `dir`: the tokens its RL phases drew (the generate phase) and
// trained (its steps' tokens, the SFT warm start's apart: every rank runs that on its own).
inline std::pair<double, double> reported_rl_tokens(const std::string& dir) {
  const CommandResult report = run_rlfusion("report " + dir + " --json");
  EXPECT_EQ(report.exit_code, 0) << report.output;
  const std::string& json = report.output;
  const size_t generate = json.find("{\"phase\":\"generate\"");
  EXPECT_NE(generate, std::string::npos) << json;
  double trained = 0;
  const size_t steps = json.find("\"steps\":["), end = json.find(']', steps);
  for (size_t at = json.find("\"tokens\":", steps); at < end;
       at = json.find("\"tokens\":", at + 1)) {
    trained += std::stod(json.substr(at + 9));
  }
  return {generate == std::string::npos ? -1 : json_number(json, "tokens", generate), trained};
}

// The run in `dir` generated and trained the data-parallel run's samples (in `dp_dir`): its trace
// counts their tokens once, however many ranks of a TP group or a pipeline drew or trained them.
inline void expect_trace_counts_tokens_like(const std::string& dp_dir, const std::string& dir) {
  const auto [dp_generated, dp_trained] = reported_rl_tokens(dp_dir);
  const auto [generated, trained] = reported_rl_tokens(dir);
  EXPECT_GT(dp_trained, 0);
  EXPECT_EQ(generated, dp_generated) << dir;
  EXPECT_EQ(trained, dp_trained) << dir;
}

}  // namespace rlf::test
