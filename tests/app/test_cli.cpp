// End-to-end: the rlfusion binary on bad input (one clear message, exit code 2, nothing written)
// and on a short real run.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "kernels/error.h"
#include "src/app/options.h"
#include "src/model/model_config.h"
#include "tests/app/json_output.h"
#include "tests/app/read_parameters.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

using Result = test::CommandResult;
using test::run_rlfusion;

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("rlfusion-test-" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

void expect_config_error(const Result& r, const std::string& expected_text) {
  EXPECT_EQ(r.exit_code, kExitConfigError) << r.output;
  EXPECT_NE(r.output.find("rlfusion: error:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(expected_text), std::string::npos) << r.output;
}

TEST(CommandLine, UnknownOptionIsRejectedWithExitCode2) {
  expect_config_error(run_rlfusion("sft --model tiny --no-such-option 3"), "no-such-option");
}

TEST(CommandLine, UnknownCommandIsRejected) {
  expect_config_error(run_rlfusion("frobnicate"), "unknown command 'frobnicate'");
}

TEST(CommandLine, MalformedValueNamesTheOption) {
  expect_config_error(run_rlfusion("sft --model tiny --steps many"), "steps");
  expect_config_error(run_rlfusion("sft --model tiny --device-memory lots"), "--device-memory");
}

TEST(CommandLine, MalformedIniFileIsRejected) {
  const std::string dir = temp_dir("ini");
  std::ofstream(dir + "/bad.ini") << "steps = 3\nthis line is not a key value pair\n";
  expect_config_error(run_rlfusion("sft --config " + dir + "/bad.ini"), "bad.ini");
  std::ofstream(dir + "/unknown.ini") << "stepz = 3\n";
  expect_config_error(run_rlfusion("sft --config " + dir + "/unknown.ini"), "stepz");
}

TEST(CommandLine, ModelThatDoesNotFitIsRejected) {
  const std::string dir = temp_dir("model");
  std::ofstream(dir + "/heads.ini") << "[model]\nvocab_size = 32\nd_model = 30\nn_layers = 1\n"
                                       "n_heads = 4\nn_experts = 4\ntop_k = 2\nd_ff = 8\n"
                                       "max_seq_len = 32\n";
  expect_config_error(run_rlfusion("sft --model " + dir + "/heads.ini"), "n_heads = 4 must divide");
  std::ofstream(dir + "/topk.ini") << "[model]\nvocab_size = 32\nd_model = 32\nn_layers = 1\n"
                                      "n_heads = 4\nn_experts = 4\ntop_k = 5\nd_ff = 8\n"
                                      "max_seq_len = 32\n";
  expect_config_error(run_rlfusion("sft --model " + dir + "/topk.ini"), "top_k = 5");
  expect_config_error(run_rlfusion("sft --model no-such-model"), "no-such-model");
}

TEST(CommandLine, ArenaTooSmallForTheModelIsRejectedBeforeWriting) {
  const std::string dir = temp_dir("arena");
  const Result r = run_rlfusion("sft --model small --device-memory 1MiB --run-dir " + dir + "/run");
  expect_config_error(r, "--device-memory");
  EXPECT_FALSE(std::filesystem::exists(dir + "/run/model.h5"));
}

TEST(PolicyCommands, BadRlInputIsRejectedBeforeAnyOutput) {
  const std::string dir = temp_dir("rl-bad");
  expect_config_error(
      run_rlfusion("train --model tiny --task no-such-task --run-dir " + dir + "/a"),
      "no-such-task");
  expect_config_error(run_rlfusion("train --model tiny --group-size 1 --run-dir " + dir + "/a"),
                      "--group-size");
  expect_config_error(run_rlfusion("train --model tiny --prompts 0 --run-dir " + dir + "/a"),
                      "--prompts");
  expect_config_error(run_rlfusion("eval --model tiny --task add"), "--init");
  EXPECT_FALSE(std::filesystem::exists(dir + "/a"));
}

TEST(PolicyCommands, SftTrainEvalWriteTheirRunDirectoriesAndGuardFinishedRuns) {
  const std::string dir = temp_dir("rl-flow");
  const std::string common = " --model tiny --task add --threads 1 --eval-prompts 16 ";
  const Result sft = run_rlfusion("sft" + common + "--steps 20 --run-dir " + dir + "/sft");
  ASSERT_EQ(sft.exit_code, 0) << sft.output;
  for (const char* file : {"model.h5", "config.ini", "log.txt", "summary.json"}) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/sft/" + file)) << file;
  }
  // The resolved config reproduces the run.
  std::ifstream config(dir + "/sft/config.ini");
  const std::string text((std::istreambuf_iterator<char>(config)),
                         std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("steps = 20"), std::string::npos) << text;

  // A finished run is not overwritten by accident; its files stay as they were.
  const auto before = std::filesystem::last_write_time(dir + "/sft/model.h5");
  expect_config_error(run_rlfusion("sft" + common + "--steps 20 --run-dir " + dir + "/sft"),
                      "--overwrite");
  EXPECT_EQ(std::filesystem::last_write_time(dir + "/sft/model.h5"), before);

  const Result train = run_rlfusion("train" + common +
                                    "--steps 2 --prompts 4 --group-size 2 "
                                    "--kl-coef 0.01 --init " +
                                    dir + "/sft/model.h5 --run-dir " + dir + "/train");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  EXPECT_NE(train.output.find("held-out accuracy after RL"), std::string::npos) << train.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/train/model.h5"));
  // The experts its training calls touched, a layer on average (SFT's and RL's): tiny's top 2 of 4.
  std::ifstream summary_file(dir + "/train/summary.json");
  const std::string summary((std::istreambuf_iterator<char>(summary_file)),
                            std::istreambuf_iterator<char>());
  const double touched = test::json_number(summary, "active_experts_per_call");
  EXPECT_GE(touched, 2) << summary;
  EXPECT_LE(touched, 4) << summary;
  // `report` gives it to the planner from the trace, as written in summary.json.
  const Result report = run_rlfusion("report " + dir + "/train");
  ASSERT_EQ(report.exit_code, 0) << report.output;
  const size_t line = report.output.find("# for rlfusion plan: job.active_experts = ");
  ASSERT_NE(line, std::string::npos) << report.output;
  EXPECT_DOUBLE_EQ(std::stod(report.output.substr(line + 42)), touched) << report.output;

  const Result eval = run_rlfusion("eval" + common + "--init " + dir + "/train/model.h5 --json");
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_NE(eval.output.find("\"command\":\"eval\""), std::string::npos) << eval.output;

  // A parameter file of another model is rejected, naming the file.
  expect_config_error(
      run_rlfusion("eval --model small --task add --init " + dir + "/train/model.h5"), "model.h5");
}

TEST(Options, ParseBytesAcceptsUnitsAndRejectsGarbage) {
  EXPECT_EQ(parse_bytes("4GiB", "--x"), size_t(4) << 30);
  EXPECT_EQ(parse_bytes("512MiB", "--x"), size_t(512) << 20);
  EXPECT_EQ(parse_bytes("1000", "--x"), 1000u);
  EXPECT_EQ(parse_bytes("1.5K", "--x"), 1536u);
  EXPECT_THROW(parse_bytes("-1G", "--x"), ConfigError);
  EXPECT_THROW(parse_bytes("4 parsecs", "--x"), ConfigError);
  EXPECT_THROW(parse_bytes("", "--x"), ConfigError);
}

TEST(ModelConfigFiles, ShippedModelsLoadAndValidate) {
  for (const char* name : {"tiny", "small", "pangu-ultra-moe-718b"}) {
    const ModelConfig c =
        load_model_config(std::string(RLFUSION_SOURCE_DIR) + "/inputs/models/" + name + ".ini");
    EXPECT_EQ(c.name, name);
    EXPECT_GT(c.parameter_count(), 0);
  }
  const ModelConfig small =
      load_model_config(std::string(RLFUSION_SOURCE_DIR) + "/inputs/models/small.ini");
  EXPECT_GE(small.parameter_count(), 10'000'000);
  EXPECT_LE(small.parameter_count(), 30'000'000);
  const ModelConfig big = load_model_config(std::string(RLFUSION_SOURCE_DIR) +
                                            "/inputs/models/pangu-ultra-moe-718b.ini");
  EXPECT_GT(big.parameter_count(), 600'000'000'000);
}

}  // namespace
}  // namespace rlf

namespace rlf {
namespace {

// SFT to partial accuracy, then RL must raise held-out accuracy by a clear margin, on two seeds.
// (The full run of `make run` is the same recipe at 2000 RL steps.)
TEST(RlEndToEnd, RlRaisesHeldOutAccuracyAfterSftOnTwoSeeds) {
  for (int seed : {1, 2}) {
    const std::string dir = temp_dir("rl-e2e-" + std::to_string(seed));
    const Result r =
        run_rlfusion("train --model tiny --task sort --threads 1 --seed " + std::to_string(seed) +
                     " --sft-steps 150 --sft-learning-rate 0.01 --steps 800 --warmup-steps 10"
                     " --learning-rate 0.0003 --eval-prompts 200 --json --run-dir " +
                     dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto value = [&](const std::string& key) {
      const auto at = r.output.find("\"" + key + "\":");
      EXPECT_NE(at, std::string::npos) << key << "\n" << r.output;
      return std::stod(r.output.substr(at + key.size() + 3));
    };
    const double before = value("heldout_accuracy_before_rl");
    const double after = value("heldout_accuracy_after_rl");
    EXPECT_GT(before, 0.2) << "SFT should reach partial accuracy (seed " << seed << ")";
    EXPECT_LT(before, 0.9) << "SFT should leave room for RL (seed " << seed << ")";
    EXPECT_GE(after - before, 0.05)
        << "RL gain on seed " << seed << ": " << before << " -> " << after;
  }
}

}  // namespace
}  // namespace rlf

namespace rlf {
namespace {

TEST(RlEndToEnd, SameSeedSameRunBitForBit) {
  const std::string dir = temp_dir("rl-repeat");
  const std::string args =
      "train --model tiny --task long-add --threads 2 --seed 4 --sft-steps 20"
      " --steps 5 --prompts 4 --group-size 4 --kl-coef 0.05"
      " --eval-prompts 8 --run-dir ";
  ASSERT_EQ(run_rlfusion(args + dir + "/a").exit_code, 0);
  ASSERT_EQ(run_rlfusion(args + dir + "/b").exit_code, 0);
  const auto a = test::read_tiny_parameters(dir + "/a/model.h5");
  const auto b = test::read_tiny_parameters(dir + "/b/model.h5");
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace rlf
