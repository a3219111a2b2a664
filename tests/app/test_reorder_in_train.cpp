// `train --reorder-samples` end to end: data-parallel learners (disaggregated) and fused ranks
// move each step's samples to the greedy assignment's ranks and train like the in-order run (the
// same per-step rows, the model within float rounding), two runs with one seed give bit-identical
// weights, and options reordering does not support stop every rank with exit code 2.
#include <gtest/gtest.h>

#include <cstring>
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

// Heavy-tailed response lengths, so that contiguous shares are uneven. Micro-batches of one
// sample: the routers' load-balancing loss is a function of each micro-batch's routing, so only
// then is the reordered step's gradient the in-order one's up to float rounding.
const std::string kHeavyTailRun =
    "train --model tiny --task sort-heavytail --sft-steps 60 --sft-learning-rate 0.01 --steps 4 "
    "--prompts 8 --group-size 4 --eval-prompts 16 --log-every 1 --json --micro-batch 1 ";

struct Runs {
  CommandResult in_order, first, second;
  std::string in_order_dir, first_dir, second_dir;
};

Runs run_three(const std::string& name, int ranks, const std::string& layout) {
  Runs r;
  r.in_order_dir = test::fresh_temp_dir("reorder-" + name + "-off");
  r.first_dir = test::fresh_temp_dir("reorder-" + name + "-a");
  r.second_dir = test::fresh_temp_dir("reorder-" + name + "-b");
  r.in_order = test::run_rlfusion(kHeavyTailRun + layout + " --run-dir " + r.in_order_dir, ranks);
  const std::string reordered = kHeavyTailRun + layout + " --reorder-samples counted --run-dir ";
  r.first = test::run_rlfusion(reordered + r.first_dir, ranks);
  r.second = test::run_rlfusion(reordered + r.second_dir, ranks);
  return r;
}

void expect_reordered_like_in_order(const Runs& r) {
  ASSERT_EQ(r.in_order.exit_code, 0) << r.in_order.output;
  ASSERT_EQ(r.first.exit_code, 0) << r.first.output;
  ASSERT_EQ(r.second.exit_code, 0) << r.second.output;
  EXPECT_EQ(r.in_order.output.find("# reorder step"), std::string::npos);
  EXPECT_NE(r.first.output.find("# reorder step 4 (counted costs)"), std::string::npos)
      << r.first.output;
  EXPECT_NE(r.first.output.find("# data reordering (counted) over 4 steps"), std::string::npos)
      << r.first.output;
  // The heavy tail made the contiguous shares uneven somewhere: samples moved, bytes counted.
  EXPECT_GT(test::json_number(r.first.output, "reorder_moved_samples"), 0) << r.first.output;
  EXPECT_GT(test::json_number(r.first.output, "reorder_bytes_moved"), 0) << r.first.output;
  EXPECT_LE(test::json_number(r.first.output, "reorder_predicted_reordered"),
            test::json_number(r.first.output, "reorder_predicted_in_order"));
  // The in-order run's rows (the per-step reorder lines interleave the table) and its model
  // within float rounding (normalized squared error below 1e-6: a sample trained twice or not at
  // all is off by orders more).
  const auto rows = test::progress_rows(r.in_order.output);
  ASSERT_EQ(rows.size(), 4u) << r.in_order.output;
  EXPECT_EQ(test::progress_rows(r.first.output), rows) << r.first.output;
  const std::vector<float> in_order = test::read_saved_parameters(r.in_order_dir + "/model.h5");
  const std::vector<float> a = test::read_saved_parameters(r.first_dir + "/model.h5");
  const std::vector<float> b = test::read_saved_parameters(r.second_dir + "/model.h5");
  ASSERT_EQ(a.size(), in_order.size());
  EXPECT_LT(test::nmse(a.data(), in_order.data(), in_order.size()), 1e-6);
  // One seed, one plan: the same weights bit for bit.
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_EQ(test::progress_rows(r.second.output), test::progress_rows(r.first.output));
}

TEST(ReorderInTrain, DisaggregatedLearnersTrainLikeInOrderAndRepeatBitForBit) {
  expect_reordered_like_in_order(run_three("disaggregated", 3, "--learners 2 --actors 1"));
}

TEST(ReorderInTrain, FusedRanksTrainLikeInOrderAndRepeatBitForBit) {
  expect_reordered_like_in_order(run_three("fused", 2, "--mode fused"));
}

TEST(ReorderInTrain, FusedExpertParallelRanksTrainLikeInOrder) {
  // The EP group's ranks train different sample counts after reordering; they run the same
  // number of micro-batches (the larger), the extra ones empty.
  expect_reordered_like_in_order(run_three("fused-ep", 2, "--mode fused --expert-parallel 2"));
}

TEST(ReorderInTrain, ExpertParallelLearnersTrainLikeInOrder) {
  expect_reordered_like_in_order(
      run_three("disaggregated-ep", 3,
                "--learners 2 --actors 1 --expert-parallel 2 --actor-expert-parallel 1"));
}

TEST(ReorderInTrain, MeasuredCostsChangeThePlanNotTheMath) {
  // Measured plans follow the machine's timing (not reproducible), but whichever plan a step
  // makes, it trains the in-order step's samples with its normalizer.
  const std::string in_order_dir = test::fresh_temp_dir("reorder-measured-off");
  const std::string dir = test::fresh_temp_dir("reorder-measured");
  const CommandResult in_order =
      test::run_rlfusion(kHeavyTailRun + "--mode fused --run-dir " + in_order_dir, 2);
  const CommandResult measured = test::run_rlfusion(
      kHeavyTailRun + "--mode fused --reorder-samples measured --run-dir " + dir, 2);
  ASSERT_EQ(in_order.exit_code, 0) << in_order.output;
  ASSERT_EQ(measured.exit_code, 0) << measured.output;
  EXPECT_NE(measured.output.find("# data reordering (measured) over 4 steps"), std::string::npos)
      << measured.output;
  EXPECT_EQ(test::progress_rows(measured.output), test::progress_rows(in_order.output))
      << measured.output;
  const std::vector<float> want = test::read_saved_parameters(in_order_dir + "/model.h5");
  const std::vector<float> got = test::read_saved_parameters(dir + "/model.h5");
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(test::nmse(got.data(), want.data(), want.size()), 1e-6);
}

TEST(ReorderInTrain, UnsupportedValuesAndCombinationsStopEveryRankBeforeOutput) {
  const std::string dir = test::fresh_temp_dir("reorder-bad");
  test::expect_stops_before_output(
      {{2, "--reorder-samples sometimes", "--reorder-samples must be 'off', 'counted' or"},
       {2, "--reorder-samples counted --pipeline-parallel 2",
        "--reorder-samples counted is not supported with --tensor-parallel or "
        "--pipeline-parallel"},
       {2, "--reorder-samples measured --tensor-parallel 2",
        "--reorder-samples measured is not supported with --tensor-parallel"},
       {2, "--reorder-samples counted --minibatches 2",
        "--reorder-samples counted is not supported with --minibatches 2"},
       {3, "--mode disaggregated --learners 2 --actors 1 --reorder-samples bogus",
        "--reorder-samples must be"}},
      dir);
  const CommandResult one_rank =
      test::run_rlfusion(test::kModelParallelRun + "--reorder-samples counted --run-dir " + dir);
  EXPECT_EQ(one_rank.exit_code, 2) << one_rank.output;
  EXPECT_NE(one_rank.output.find("needs data-parallel ranks"), std::string::npos)
      << one_rank.output;
  EXPECT_FALSE(std::filesystem::exists(dir));
}

}  // namespace
}  // namespace rlf
