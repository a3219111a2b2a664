// jobs/tables/table1.sh and table2.sh on this machine (2 ranks): the measured half runs the RL
// job in each setting and prints its rows, the predicted half the planner's table beside the
// published figures; a run with too few ranks is refused before it starts.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <string>

#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

test::CommandResult run_script(const std::string& command) {
  return test::run_in_source_tree(command);
}

TEST(TableScripts, Table1MeasuresEveryModeAndPrintsThePrediction) {
  const test::CommandResult r = run_script(
      "RANKS=2 jobs/tables/table1.sh --model tiny --steps 4 --run-dir /tmp/rlfusion-table1-" +
      std::to_string(getpid()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* text :
       {"# Table 1, MEASURED on 2 ranks", "\n  disaggregated ", "\n  fused ", "\n  fused s=1 ",
        "# Table 1, PREDICTED at the published scale", "fused + StaleSync"}) {
    EXPECT_NE(r.output.find(text), std::string::npos) << text << "\n" << r.output;
  }
  EXPECT_EQ(run_script("RANKS=1 jobs/tables/table1.sh").exit_code, 2);
}

TEST(TableScripts, Table2MeasuresSynchronousAndStaleSyncPerUnitAndPrintsThePrediction) {
  const std::string study = "/tmp/rlfusion-table2-" + std::to_string(getpid());
  const test::CommandResult r =
      run_script("RANKS=2 STUDY_DIR=" + study +
                 " jobs/tables/table2.sh --model tiny --task sort --sft-steps 0 --steps 3 "
                 "--group-size 4 --eval-prompts 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // One unit of 2 ranks: linearity 100% by definition, both tokens/s measured.
  const auto row = r.output.find("\n      1      2       16 ");
  ASSERT_NE(row, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("100%", row), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("# Table 2, PREDICTED at the published scale"), std::string::npos);
  EXPECT_NE(r.output.find("91% linearity"), std::string::npos) << r.output;
  EXPECT_EQ(run_script("RANKS=1 jobs/tables/table2.sh").exit_code, 2);
}

}  // namespace
}  // namespace rlf
