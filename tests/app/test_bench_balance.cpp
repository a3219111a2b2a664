// End-to-end: `rlfusion bench balance --json` on the issue's setting (64 experts, 8 devices, one
// redundant slot, 16k tokens/step, top-8, Zipf(1.2) with drift), checked on the JSON twin: the
// load figures are seeded counts, so the targets are asserted. A given cost model keeps the run
// free of timing; bad options stop the run with exit code 2.
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

// The value of `key` in the row of (policy, slots per device, interval).
double row(const std::string& json, const std::string& policy, int slots, int interval,
           const std::string& key) {
  const std::string head = "{\"policy\":\"" + policy +
                           "\",\"slots_per_device\":" + std::to_string(slots) +
                           ",\"interval\":" + std::to_string(interval) + ",";
  const auto at = json.find(head);
  EXPECT_NE(at, std::string::npos) << head << " in " << json;
  return at == std::string::npos ? std::nan("") : test::json_number(json, key, at);
}

TEST(BenchBalance, MeetsTheTargetsOnTheIssueSetting) {
  const test::CommandResult r =
      test::run_rlfusion("bench balance --json --steps 100 --cost-model 1e-4,4e-6,2e-8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string json = test::json_line(r.output, "balance");
  ASSERT_FALSE(json.empty()) << r.output;
  const double ours = row(json, "ours", 9, 5, "imbalance");
  EXPECT_LE(ours, 1.15) << json;
  EXPECT_GE(ours, row(json, "ours", 9, 5, "load_imbalance"));  // migration time counted
  EXPECT_LT(ours, row(json, "eplb", 9, 5, "imbalance"));
  EXPECT_LT(ours, row(json, "eplb", 9, 20, "imbalance"));
  EXPECT_LT(ours, row(json, "static", 9, 5, "imbalance"));
  EXPECT_LT(row(json, "ours", 8, 5, "imbalance"), row(json, "static", 8, 5, "imbalance"));
  EXPECT_GT(row(json, "ours", 9, 5, "migrations"), 0);
  EXPECT_EQ(row(json, "ours", 9, 5, "refused_arena"), 0);
  const auto reorder = json.find("\"reorder\":{");
  ASSERT_NE(reorder, std::string::npos) << json;
  EXPECT_LE(test::json_number(json, "reordered", reorder), 1.10);
  EXPECT_LT(test::json_number(json, "reordered", reorder),
            test::json_number(json, "in_order", reorder));
  EXPECT_EQ(test::json_number(json, "batch_kept", reorder), 1);
  // Same seed, same figures.
  const test::CommandResult again =
      test::run_rlfusion("bench balance --json --steps 100 --cost-model 1e-4,4e-6,2e-8");
  EXPECT_EQ(test::json_line(again.output, "balance"), json);
}

TEST(BenchBalance, BadOptionsAreConfigErrors) {
  const std::vector<std::string> cases = {"--horizon 0",
                                          "--min-gain-ratio -1",
                                          "--min-gain-ratio nan",
                                          "--rebalance-interval 0",
                                          "--level-smoothing 0",
                                          "--trend-smoothing 2",
                                          "--migration-intra-bandwidth 0",
                                          "--devices-per-node 3",
                                          "--eplb-groups 7",
                                          "--cost-model 1,2",
                                          "--repeats 2"};
  std::vector<test::RlfusionRun> runs;
  for (const std::string& args : cases) runs.push_back({"bench balance " + args});
  const std::vector<test::CommandResult> results = test::run_rlfusion_concurrently(runs);
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string& args = cases[i];
    const test::CommandResult& r = results[i];
    EXPECT_EQ(r.exit_code, kExitConfigError) << args << ": " << r.output;
    EXPECT_EQ(r.output.find("# part 1"), std::string::npos) << args;  // before any work
  }
}

}  // namespace
}  // namespace rlf
