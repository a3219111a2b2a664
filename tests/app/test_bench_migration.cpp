// End-to-end: `rlfusion bench migration --json` on 2 ranks: moving the hot experts off rank 0
// leaves the MoE output bit-identical and evens out the rows per rank (counts; the times of an
// oversubscribed run are not asserted); the replica phase copies hot experts into the spare
// slots and keeps the output within float tolerance. Bad options stop it with exit code 2.
#include <gtest/gtest.h>

#include <string>

#include "kernels/error.h"
#include "tests/app/json_output.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

TEST(BenchMigration, MovesTheHotExpertsAndKeepsTheOutput) {
  const test::CommandResult r =
      test::run_rlfusion("bench migration --json --tokens 512 --repeats 3 --threads 1", 2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string json = test::json_line(r.output, "migration");
  ASSERT_FALSE(json.empty()) << r.output;
  EXPECT_EQ(test::json_number(json, "bit_identical"), 1);
  EXPECT_GT(test::json_number(json, "moved_experts"), 0);
  EXPECT_GT(test::json_number(json, "sent_bytes"), 0);
  const double mean = test::json_number(json, "rows_mean");
  EXPECT_GT(test::json_number(json, "before_rows_max") / mean, 1.3);
  EXPECT_LT(test::json_number(json, "after_rows_max") / mean, 1.1);
  EXPECT_EQ(test::json_number(json, "redundant_slots"), 1);
  EXPECT_GT(test::json_number(json, "replica_copies"), 0);
  EXPECT_GT(test::json_number(json, "replica_sent_bytes"), 0);
  EXPECT_LT(test::json_number(json, "replica_rows_max") / mean, 1.1);
  EXPECT_EQ(test::json_number(json, "replica_match"), 1);
  EXPECT_LE(test::json_number(json, "replica_error"), 1e-5);
}

TEST(BenchMigration, BadOptionsAreConfigErrors) {
  EXPECT_EQ(test::run_rlfusion("bench migration --repeats 2", 2).exit_code, kExitConfigError);
  EXPECT_EQ(test::run_rlfusion("bench migration --zipf -1", 2).exit_code, kExitConfigError);
  EXPECT_EQ(test::run_rlfusion("bench migration").exit_code, kExitConfigError);  // one rank
  // 8 experts on 2 ranks: at most 4 spare slots per rank.
  EXPECT_EQ(test::run_rlfusion("bench migration --redundant-slots -1", 2).exit_code,
            kExitConfigError);
  EXPECT_EQ(test::run_rlfusion("bench migration --redundant-slots 5", 2).exit_code,
            kExitConfigError);
}

}  // namespace
}  // namespace rlf
