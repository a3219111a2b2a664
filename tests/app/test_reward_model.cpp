// The learned reward model end to end: `sft --reward-model` trains a verifier on `sort` well above
// chance; `train --reward-model` blends it into the rewards (blend 0 reproduces the task-reward
// run bit for bit) on one rank, disaggregated and fused; `--mode fused-all` places the reference
// and the reward model in the device arena and trains the same weights as `fused`; bad input
// stops every rank with exit code 2 and one message.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/app/json_output.h"
#include "tests/app/progress_rows.h"
#include "tests/app/read_parameters.h"
#include "tests/app/run_rlfusion.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

using Result = test::CommandResult;

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("rlfusion-reward-" + name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

const std::string kShortRun =
    "train --model tiny --task sort --sft-steps 100 --sft-learning-rate 0.01 --steps 6 "
    "--prompts 8 --group-size 4 --eval-prompts 32 --log-every 3 --json ";

// One verifier for every test of this file (trained once: about a second).
// Trained once per test process. ctest runs every test in a process of its own, several at a time,
// so each process trains into a directory of its own (a shared one would be rewritten under a
// run that is reading it).
const std::string& verifier_path() {
  static const std::string path = [] {
    const std::string dir = temp_dir("verifier-" + std::to_string(getpid()));
    const Result r = test::run_rlfusion(
        "sft --reward-model --model tiny --task sort --steps 400 --eval-prompts 400 --json "
        "--run-dir " +
        dir);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return dir + "/model.h5";
  }();
  return path;
}

TEST(RewardModelSft, TheVerifierLearnsSortWellAboveChance) {
  const std::string& model = verifier_path();
  const std::string summary =
      read_file(std::filesystem::path(model).parent_path() / "summary.json");
  // Measured: 0.74-0.76 over seeds 1-3 at 400 steps (chance 0.50; 0.82 at 1000 steps).
  EXPECT_GT(test::json_number(summary, "verifier_accuracy_after"), 0.65) << summary;
  EXPECT_NEAR(test::json_number(summary, "chance_accuracy"), 0.5, 0.06) << summary;
  EXPECT_NE(summary.find("\"kind\":\"reward-model\""), std::string::npos) << summary;
}

TEST(RewardModelTrain, BlendZeroIsTheTaskRewardRunBitForBitAndBlendOneIsNot) {
  const std::string plain = temp_dir("plain"), zero = temp_dir("zero"), one = temp_dir("one");
  const Result a = test::run_rlfusion(kShortRun + "--run-dir " + plain);
  const Result b = test::run_rlfusion(kShortRun + "--reward-model " + verifier_path() +
                                      " --reward-blend 0 --run-dir " + zero);
  const Result c =
      test::run_rlfusion(kShortRun + "--reward-model " + verifier_path() + " --run-dir " + one);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(test::read_tiny_parameters(plain + "/model.h5"),
            test::read_tiny_parameters(zero + "/model.h5"));
  EXPECT_NE(test::read_tiny_parameters(plain + "/model.h5"),
            test::read_tiny_parameters(one + "/model.h5"));
  EXPECT_NE(c.output.find("1.00 x learned reward model"), std::string::npos) << c.output;
  const std::string summary = read_file(one + "/summary.json");
  EXPECT_NE(summary.find("\"reward\":\"learned\""), std::string::npos) << summary;
  EXPECT_EQ(test::json_number(summary, "reward_blend"), 1.0) << summary;
}

TEST(RewardModelTrain, FusedAllPlacesTheModelsOnTheDeviceAndTrainsWhatFusedTrains) {
  const std::string options =
      "--kl-coef 0.01 --reward-model " + verifier_path() + " --reward-blend 0.5 ";
  const std::string fused = temp_dir("fused"), all = temp_dir("fused-all");
  const Result f = test::run_rlfusion(kShortRun + options + "--mode fused --run-dir " + fused, 2);
  const Result a = test::run_rlfusion(kShortRun + options + "--mode fused-all --run-dir " + all, 2);
  ASSERT_EQ(f.exit_code, 0) << f.output;
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(f.output.find("in a host arena of its own"), std::string::npos) << f.output;
  EXPECT_NE(a.output.find("in the device arena (with the policy)) + 0.50 x"), std::string::npos)
      << a.output;
  EXPECT_NE(a.output.find("# reference model (KL):"), std::string::npos) << a.output;
  EXPECT_NE(read_file(all + "/summary.json").find("\"mode\":\"fused-all\""), std::string::npos);
  EXPECT_NE(read_file(fused + "/summary.json").find("\"mode\":\"fused\""), std::string::npos);
  // Placement never changes the math.
  EXPECT_EQ(test::read_tiny_parameters(fused + "/model.h5"),
            test::read_tiny_parameters(all + "/model.h5"));
  // Disaggregated: the actor scores with its own copy.
  const Result d = test::run_rlfusion(kShortRun + options + "--run-dir " + temp_dir("disagg"), 2);
  ASSERT_EQ(d.exit_code, 0) << d.output;
  EXPECT_NE(d.output.find("\"reward\":\"learned\""), std::string::npos) << d.output;
}

// Model parallelism with a learned reward (refused before 2026-12-04): the reward model is whole on
// every generating rank, so fused TP 2, PP 2 (also generating inside the pipeline, each rank
// scoring its own samples), TP 2 x PP 2, EP 2 generating at TP 2 and TP 2 x EP 2, and disaggregated
// TP 2 learners and TP 2 actors, score and train like the data-parallel run (fused on 2 ranks;
// disaggregated 1 learner + 1 actor): the same rows every step (reward, accuracy, response length,
// KL) and the saved model within float rounding.
TEST(RewardModelTrain, ModelParallelLayoutsScoreAndTrainLikeTheDataParallelRun) {
  std::string run = kShortRun + "--reward-model " + verifier_path() + " --reward-blend 0.5 ";
  run.replace(run.find("--log-every 3"), 13, "--log-every 1");
  struct Layout {
    int ranks;
    std::string options;
  };
  for (const bool fused : {true, false}) {
    const std::string mode = fused ? "--mode fused " : "--mode disaggregated ";
    const std::string dp_dir = temp_dir(fused ? "dp-fused" : "dp-disaggregated");
    const Result dp = test::run_rlfusion(
        run + mode + (fused ? "" : "--learners 1 --actors 1 ") + "--run-dir " + dp_dir, 2);
    ASSERT_EQ(dp.exit_code, 0) << dp.output;
    const std::vector<std::vector<std::string>> want = test::progress_rows(dp.output, 5);
    ASSERT_EQ(want.size(), 6u) << dp.output;
    const std::vector<float> dp_model = test::read_tiny_parameters(dp_dir + "/model.h5");
    const std::vector<Layout> layouts =
        fused ? std::vector<Layout>{{2, "--tensor-parallel 2"},
                                    {2, "--pipeline-parallel 2"},
                                    {2, "--pipeline-parallel 2 --actor-pipeline-parallel 2"},
                                    {4, "--tensor-parallel 2 --pipeline-parallel 2"},
                                    {4, "--expert-parallel 2 --actor-tensor-parallel 2"},
                                    {4, "--tensor-parallel 2 --expert-parallel 2"}}
              : std::vector<Layout>{{3, "--learners 2 --actors 1 --tensor-parallel 2"},
                                    {4, "--learners 2 --actors 2 --actor-tensor-parallel 2"}};
    for (const Layout& layout : layouts) {
      SCOPED_TRACE(mode + layout.options);
      const std::string dir = temp_dir("model-parallel");
      const Result r =
          test::run_rlfusion(run + mode + layout.options + " --run-dir " + dir, layout.ranks);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find("\"reward\":\"learned\""), std::string::npos) << r.output;
      EXPECT_EQ(test::progress_rows(r.output, 5), want) << r.output;
      const std::vector<float> model = test::read_tiny_parameters(dir + "/model.h5");
      ASSERT_EQ(model.size(), dp_model.size());
      // Measured 1e-15 to 5e-8, and 1.6e-6 where one TP group of 2 generates every sample (fused
      // TP 2 on 2 ranks, the TP 2 actor): its log-probs round differently, and with a blended
      // reward every sample has an advantage, so more weights take AdamW steps from
      // rounding-level differences. A model that trained on other samples is off by orders more.
      EXPECT_LT(test::nmse(model.data(), dp_model.data(), dp_model.size()), 1e-5);
    }
  }
}

void expect_config_error(const Result& r, const std::string& message) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("# rlfusion"), std::string::npos) << "work started:\n" << r.output;
}

TEST(RewardModelTrain, BadInputStopsEveryRankBeforeAnyWork) {
  const std::string dir = " --run-dir " + temp_dir("bad");
  const std::string policy = temp_dir("policy");
  ASSERT_EQ(test::run_rlfusion("train --model tiny --task sort --steps 1 --prompts 8 "
                               "--group-size 4 --eval-prompts 4 --run-dir " +
                               policy)
                .exit_code,
            0);
  for (int ranks : {0, 2}) {
    expect_config_error(test::run_rlfusion(kShortRun + "--reward-model /no/such.h5" + dir, ranks),
                        "parameter file '/no/such.h5' does not exist");
    expect_config_error(
        test::run_rlfusion(
            kShortRun + "--mode fused-all --reward-model " + policy + "/model.h5" + dir, ranks),
        "holds a policy, not a reward model");
    expect_config_error(
        test::run_rlfusion(
            kShortRun + "--reward-model " + verifier_path() + " --reward-blend 1.5" + dir, ranks),
        "--reward-blend must be in [0, 1]");
    expect_config_error(test::run_rlfusion(kShortRun + "--reward-blend 0.5" + dir, ranks),
                        "--reward-blend needs --reward-model");
  }
  expect_config_error(
      test::run_rlfusion(kShortRun + "--init " + verifier_path() + dir),
      "holds a reward model (written by rlfusion sft --reward-model), not a policy");
  expect_config_error(test::run_rlfusion("sft --reward-model --model tiny --task sort --init " +
                                         policy + "/model.h5" + dir),
                      "holds a policy, not a reward model");
  // fused-all counts the reference and the reward model in the memory plan and names them.
  expect_config_error(
      test::run_rlfusion(kShortRun + "--mode fused-all --kl-coef 0.1 --reward-model " +
                             verifier_path() + " --device-memory 600KiB" + dir,
                         2),
      "--mode fused-all: each rank needs");
  const Result small = test::run_rlfusion(kShortRun +
                                              "--mode fused-all --kl-coef 0.1 "
                                              "--reward-model " +
                                              verifier_path() + " --device-memory 600KiB" + dir,
                                          2);
  EXPECT_NE(small.output.find("the reward model's 149.81 KiB"), std::string::npos) << small.output;
}

}  // namespace
}  // namespace rlf
