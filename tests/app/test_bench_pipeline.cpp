// End-to-end: `rlfusion bench pipeline --json` under mpiexec on the tiny model (2 ranks: 1F1B and
// interleaved; measured stage balancing; 4 ranks as PP 2 x DP 2), checked on the JSON twin: every
// row's first step equal to the single-rank model (#wrong 0), the formula and the counted bubble
// equal, a bubble and times per rank. Times of an oversubscribed run are not asserted. Bad shapes
// and options stop every rank with exit code 2 and one message before any work.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernels/error.h"
#include "tests/app/json_output.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

const std::string kTiny =
    "bench pipeline --model tiny --sequences 2 --length 8 --repeats 1 --json ";

TEST(BenchPipeline, TwoRanksOneFOneBAndInterleavedEqualTheSingleRankModel) {
  const test::CommandResult r =
      test::run_rlfusion(kTiny + "--layers 4 --micro-batches 2,4 --virtual-stages 1,2", 2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("0 wrong OK"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("one idle core per rank"), std::string::npos) << r.output;
  const std::string json = test::json_line(r.output, "pipeline");
  EXPECT_EQ(test::json_number(json, "wrong"), 0);
  EXPECT_EQ(test::json_number(json, "ranks"), 2);
  size_t at = 0;
  for (const auto& [v, m] : {std::pair{1, 2}, {1, 4}, {2, 2}, {2, 4}}) {
    at = json.find(
        "{\"virtual_stages\":" + std::to_string(v) + ",\"micro_batches\":" + std::to_string(m), at);
    ASSERT_NE(at, std::string::npos) << "v=" << v << " m=" << m << " in " << json;
    const double formula = test::json_number(json, "formula", at);
    EXPECT_NEAR(formula, 1.0 / (m * v + 1), 1e-6);
    EXPECT_NEAR(test::json_number(json, "counted", at), formula, 1e-6);
    EXPECT_EQ(test::json_number(json, "wrong", at), 0);
    for (const char* key : {"wall_seconds", "compute_seconds", "compute_cpu_seconds"}) {
      EXPECT_GT(test::json_number(json, key, at), 0) << key;
    }
    EXPECT_GE(test::json_number(json, "bubble", at), 0);
  }
}

TEST(BenchPipeline, MeasuredStageBalancingKeepsTheResult) {
  const test::CommandResult r = test::run_rlfusion(
      kTiny + "--layers 5 --micro-batches 2 --virtual-stages 1 --balance measured", 2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("measured forward+backward per layer"), std::string::npos) << r.output;
  EXPECT_EQ(test::json_number(test::json_line(r.output, "pipeline"), "wrong"), 0) << r.output;
}

TEST(BenchPipeline, TwoDataParallelPipelinesOnFourRanks) {
  const test::CommandResult r = test::run_rlfusion(
      kTiny + "--layers 4 --pipeline-parallel 2 --micro-batches 2 --virtual-stages 2", 4);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string json = test::json_line(r.output, "pipeline");
  EXPECT_EQ(test::json_number(json, "pipeline_parallel"), 2);
  EXPECT_EQ(test::json_number(json, "wrong"), 0) << r.output;
  EXPECT_NE(json.find("\"rank\":3"), std::string::npos) << json;
}

TEST(BenchPipeline, BadShapesStopEveryRankWithExitCodeTwo) {
  for (const auto& [args, ranks, message] :
       {std::tuple<std::string, int, std::string>{"--layers 4 --virtual-stages 3", 2,
                                                  "--virtual-stages 3"},
        {"--layers 6 --virtual-stages 2", 2, "divide the model's 6 layers"},
        {"--layers 4 --virtual-stages 2 --micro-batches 3", 2, "--micro-batches 3"},
        {"--layers 8 --virtual-stages 2 --micro-batches 2", 4, "multiple of --pipeline-parallel 4"},
        {"--layers 6 --pipeline-parallel 3", 2, "must divide the world size 2"},
        {"--layers 4 --balance greedy", 2, "--balance"},
        {"--layers 4 --micro-batches 2,x", 2, "--micro-batches"}}) {
    const test::CommandResult r = test::run_rlfusion(kTiny + args, ranks);
    EXPECT_EQ(r.exit_code, kExitConfigError) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("# rlfusion bench pipeline"), std::string::npos) << args;
    // One message (rank 0 prints it for every rank), no trace of work.
    const size_t first = r.output.find("rlfusion: error:");
    ASSERT_NE(first, std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("rlfusion: error:", first + 1), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace rlf
