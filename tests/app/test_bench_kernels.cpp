// `bench kernels` on the CPU: the expert FFN rows at a spread and a concentrated routing (same
// tokens and FLOPs, fewer experts with rows), each checked against the reference kernels. Their
// times are printed, not tested (a unit test does not time).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tests/app/json_output.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

using test::json_line;
using test::json_number;
using test::run_rlfusion;

TEST(BenchKernels, ExpertFfnAtASpreadAndAConcentratedRoutingMatchTheReference) {
  const auto r = run_rlfusion("bench kernels --threads 1 --repeats 3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string json = json_line(r.output, "kernels");
  ASSERT_FALSE(json.empty()) << r.output;
  for (const std::string& row : {std::string("{\"op\":\"expert ffn spread\",\"shape\":\"48 tok "
                                             "E16 k2, 16 active\""),
                                 std::string("{\"op\":\"expert ffn hot\",\"shape\":\"48 tok E16 "
                                             "k2, 7 active\"")}) {
    const auto at = json.find(row);
    ASSERT_NE(at, std::string::npos) << row << "\n" << json;
    EXPECT_EQ(json.find("\"ok\":true", at), json.find("\"ok\":", at)) << row;
    EXPECT_LT(json_number(json, "nmse", at), 1e-8) << row;
  }
  EXPECT_GT(json_number(json, "expert_ffn_hot_over_spread"), 0);
  EXPECT_NE(r.output.find("# Expert FFN, 48 tokens, hot / spread: "), std::string::npos);
  EXPECT_NE(r.output.find("(the hot routing's busiest expert 6.0x the mean)"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace rlf
