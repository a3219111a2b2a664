// End-to-end: `rlfusion bench reorder --json` on 2 ranks: the reordered step moves samples, its
// plan predicts a slowest rank no worse than in order, and the reduced gradients of both orders
// agree (counts and the verdict; the times of an oversubscribed run are not asserted). Bad options
// stop it with exit code 2.
#include <gtest/gtest.h>

#include <string>

#include "kernels/error.h"
#include "tests/app/json_output.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

TEST(BenchReorder, MovesSamplesAndKeepsTheGradient) {
  for (const char* costs : {"counted", "measured"}) {
    SCOPED_TRACE(costs);
    const test::CommandResult r = test::run_rlfusion(
        std::string("bench reorder --json --repeats 3 --samples-per-rank 16 --threads 1 "
                    "--costs ") +
            costs,
        2);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("PASSED"), std::string::npos) << r.output;
    const std::string json = test::json_line(r.output, "reorder");
    ASSERT_FALSE(json.empty()) << r.output;
    EXPECT_EQ(test::json_number(json, "ranks"), 2);
    EXPECT_GT(test::json_number(json, "moved_samples"), 0);
    EXPECT_LE(test::json_number(json, "predicted_reordered_over_bound"),
              test::json_number(json, "predicted_in_order_over_bound"));
    EXPECT_LE(test::json_number(json, "gradient_nmse"), 1e-10);
  }
}

TEST(BenchReorder, BadOptionsAreConfigErrors) {
  EXPECT_EQ(test::run_rlfusion("bench reorder --repeats 2", 2).exit_code, kExitConfigError);
  EXPECT_EQ(test::run_rlfusion("bench reorder --costs off", 2).exit_code, kExitConfigError);
  EXPECT_EQ(test::run_rlfusion("bench reorder --samples-per-rank 0", 2).exit_code,
            kExitConfigError);
  EXPECT_EQ(test::run_rlfusion("bench reorder").exit_code, kExitConfigError);  // one rank
}

}  // namespace
}  // namespace rlf
