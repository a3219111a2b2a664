// End-to-end: `rlfusion bench overlap --json` under mpiexec (2 ranks flat, 4 ranks hierarchical
// on 2 virtual nodes), checked on the JSON twin: both emulation rows, the overlapped results equal
// to the plain ones (#wrong 0), every time and the hidden fraction present. Times of an
// oversubscribed run are not asserted. Bad options stop every rank with exit code 2.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "kernels/error.h"
#include "tests/app/json_output.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

const std::string kSmall =
    "bench overlap --tokens 48 --hidden 32 --ffn 24 --experts 8 --top-k 2 --repeats 3 "
    "--inter-node-bandwidth 1e8 --json ";

void expect_both_rows(const std::string& json) {
  for (const char* emulation : {"\"emulation\":\"on\"", "\"emulation\":\"off\""}) {
    const auto at = json.find(emulation);
    ASSERT_NE(at, std::string::npos) << emulation << " in " << json;
    EXPECT_EQ(test::json_number(json, "wrong", at), 0) << json;
    for (const char* key : {"plain_seconds", "compute_seconds", "comm_seconds",
                            "overlapped_seconds", "speedup", "waiting_seconds"}) {
      EXPECT_GT(test::json_number(json, key, at), 0) << key << " of " << emulation;
    }
    EXPECT_TRUE(std::isfinite(test::json_number(json, "hidden_fraction", at))) << json;
  }
  // Only the 'on' row has emulated link time.
  EXPECT_GT(test::json_number(json, "emulated_seconds", json.find("\"emulation\":\"on\"")), 0);
  EXPECT_EQ(test::json_number(json, "emulated_seconds", json.find("\"emulation\":\"off\"")), 0);
}

TEST(BenchOverlap, TwoRanksFlatMoreChunksThanSomeRanksNeed) {
  const test::CommandResult r = test::run_rlfusion(kSmall + "--chunks 5", 2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("hidden"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("0 wrong OK"), std::string::npos) << r.output;
  const std::string json = test::json_line(r.output, "overlap");
  EXPECT_EQ(test::json_number(json, "chunks"), 5);
  expect_both_rows(json);
}

TEST(BenchOverlap, FourRanksHierarchicalOnTwoNodes) {
  const test::CommandResult r =
      test::run_rlfusion(kSmall + "--chunks 3 --mode hierarchical --ranks-per-node 2", 4);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string json = test::json_line(r.output, "overlap");
  EXPECT_EQ(test::json_number(json, "nodes"), 2);
  expect_both_rows(json);
}

TEST(BenchOverlap, BadOptionsStopWithExitCodeTwo) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--chunks 0", "--chunks"},
      {"--mode ring", "--mode"},
      {"--ranks-per-node 3", "--ranks-per-node"},
      {"--experts 7", "--experts"},
      {"--repeats 1", "--repeats"}};
  std::vector<test::RlfusionRun> runs;
  for (const auto& [args, option] : cases) runs.push_back({kSmall + args, 2});
  const std::vector<test::CommandResult> results = test::run_rlfusion_concurrently(runs);
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [args, option] = cases[i];
    const test::CommandResult& r = results[i];
    EXPECT_EQ(r.exit_code, kExitConfigError) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(option), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("{\"bench\""), std::string::npos) << args;
  }
}

}  // namespace
}  // namespace rlf
