// The launch check at start (src/app/launch_check.h): the rules on made-up environments, then the
// binary itself started as a singleton inside a pretend srun step of 2 tasks, and on 2 ranks
// under a PBS node file of 2 and of 3 slots.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "src/app/launch_check.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

namespace fs = std::filesystem;

std::string mismatch(const std::map<std::string, std::string>& vars, int world_size) {
  return launch_mismatch(
      [&vars](const char* name) -> const char* {
        const auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      world_size);
}

std::string node_file(const std::string& name, int slots) {
  const fs::path path = fs::temp_directory_path() / ("rlfusion-launch-check-" + name);
  std::ofstream out(path);
  for (int i = 0; i < slots; ++i) out << "node" << i / 2 << "\n";
  return path.string();
}

TEST(LaunchCheck, NoSchedulerNoLauncherIsFine) {
  EXPECT_EQ(mismatch({}, 1), "");
  EXPECT_EQ(mismatch({}, 4), "");
}

TEST(LaunchCheck, SrunSingletonsAreRefused) {
  const std::string m =
      mismatch({{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_NTASKS", "4"}}, 1);
  EXPECT_NE(m.find("one of 4 tasks (SLURM_STEP_NUM_TASKS=4)"), std::string::npos) << m;
  EXPECT_NE(m.find("singletons"), std::string::npos) << m;
  EXPECT_NE(m.find("srun --mpi=pmix"), std::string::npos) << m;
}

TEST(LaunchCheck, SrunStepMustMatchTheWorld) {
  EXPECT_EQ(mismatch({{"SLURM_STEP_ID", "3"}, {"SLURM_STEP_NUM_TASKS", "4"}}, 4), "");
  EXPECT_EQ(mismatch({{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}}, 1), "");
  const std::string m = mismatch({{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "4"}}, 2);
  EXPECT_NE(m.find("the Slurm step has 4 tasks"), std::string::npos) << m;
  EXPECT_NE(m.find("world has 2 rank(s)"), std::string::npos) << m;
  // Older Slurm: no SLURM_STEP_NUM_TASKS, the step's SLURM_NTASKS / SLURM_NPROCS.
  EXPECT_NE(mismatch({{"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "3"}}, 2), "");
  EXPECT_NE(mismatch({{"SLURM_STEP_ID", "0"}, {"SLURM_NPROCS", "3"}}, 2), "");
}

TEST(LaunchCheck, BatchScriptWithoutSrunIsNotCheckedAgainstTheAllocation) {
  // `rlfusion report` run directly in a 4-task job script: no step, no launcher.
  EXPECT_EQ(mismatch({{"SLURM_JOB_ID", "7"}, {"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "0"}}, 1), "");
}

TEST(LaunchCheck, MpirunInsideSlurmIsJudgedByItsOwnCount) {
  // mpirun's ranks inherit the variables of the srun step that started its daemons (one task per
  // node), so those are not the world's count.
  EXPECT_EQ(
      mismatch(
          {{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"OMPI_COMM_WORLD_SIZE", "8"}},
          8),
      "");
  EXPECT_NE(mismatch({{"OMPI_COMM_WORLD_SIZE", "8"}}, 1), "");
  EXPECT_NE(mismatch({{"PMI_SIZE", "2"}}, 1), "");
}

TEST(LaunchCheck, PbsNodeFileSlotsMustMatchUnderALauncher) {
  const std::string two = node_file("two", 2), three = node_file("three", 3);
  EXPECT_EQ(mismatch({{"PBS_NODEFILE", two}}, 2), "");
  const std::string m = mismatch({{"PBS_NODEFILE", three}}, 2);
  EXPECT_NE(m.find("lists 3 slot(s) but the MPI world has 2 rank(s)"), std::string::npos) << m;
  EXPECT_NE(mismatch({{"PBS_NODEFILE", three}, {"OMPI_COMM_WORLD_SIZE", "1"}}, 1), "");
  // A process started without a launcher in the job script (one rank, no launcher variable).
  EXPECT_EQ(mismatch({{"PBS_NODEFILE", three}}, 1), "");
  // An unreadable node file is not evidence of anything.
  EXPECT_EQ(mismatch({{"PBS_NODEFILE", "/nonexistent/nodefile"}}, 2), "");
}

TEST(LaunchCheck, CanBeSkipped) {
  EXPECT_EQ(mismatch({{"SLURM_STEP_ID", "0"},
                      {"SLURM_STEP_NUM_TASKS", "4"},
                      {"RLFUSION_SKIP_LAUNCH_CHECK", "1"}},
                     1),
            "");
}

// The binary: a singleton inside a pretend 2-task srun step stops before any work with exit
// code 2 and the message; a matching step runs.
TEST(LaunchCheckBinary, SingletonInATwoTaskStepStopsWithExitCode2) {
  const auto bad = test::run_rlfusion("eval --model tiny --task sort --eval-prompts 2", 0,
                                      "SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=2");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("rlfusion: error: launch: this process is one of 2 tasks"),
            std::string::npos)
      << bad.output;
  const auto good = test::run_rlfusion("train --help", 0, "SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=1");
  EXPECT_EQ(good.exit_code, 0) << good.output;
}

TEST(LaunchCheckBinary, PbsNodeFileOnTwoRanks) {
  const auto good = test::run_rlfusion("train --help", 2, "PBS_NODEFILE=" + node_file("bin2", 2));
  EXPECT_EQ(good.exit_code, 0) << good.output;
  const auto bad = test::run_rlfusion("train --help", 2, "PBS_NODEFILE=" + node_file("bin3", 3));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  // One message (rank 0), every rank stopped with exit code 2 (mpiexec reports the first).
  const std::string text = "lists 3 slot(s) but the MPI world has 2 rank(s)";
  const auto at = bad.output.find(text);
  EXPECT_NE(at, std::string::npos) << bad.output;
  EXPECT_EQ(bad.output.find(text, at + 1), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace rlf
