// What the model-parallel `train --mode fused` app tests (tensor and pipeline parallelism) share:
// the run they compare with the data-parallel fused run, its per-step table, and the check that a
// bad option stops every rank before any output.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/app/run_rlfusion.h"

namespace rlf::test {

// `tiny` on `sort`: 100 SFT steps, then 6 RL steps of 8 prompts x 4 samples, logged every step.
inline const std::string kModelParallelRun =
    "train --model tiny --task sort --sft-steps 100 --sft-learning-rate 0.01 --steps 6 "
    "--prompts 8 --group-size 4 --eval-prompts 32 --log-every 1 --json ";
inline const std::string kModelParallelFusedRun = kModelParallelRun + "--mode fused ";

// An empty directory name under the system's temporary folder.
inline std::string fresh_temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("rlfusion-" + name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

// The per-step table's rows ("  step reward acc resp-len kl ..."): up to the KL column.
inline std::vector<std::string> step_rewards(const std::string& output) {
  std::vector<std::string> rows;
  const size_t header = output.find("#   step   reward");
  if (header == std::string::npos) return rows;
  size_t line_start = output.find('\n', header);
  while (line_start != std::string::npos) {
    ++line_start;
    const size_t line_end = output.find('\n', line_start);
    const std::string line = output.substr(line_start, line_end - line_start);
    if (line.empty() || line[0] == '#') break;
    rows.push_back(line.substr(0, 44));  // step, reward, acc, resp-len, kl
    line_start = line_end;
  }
  return rows;
}

struct BadOptions {
  int ranks;
  std::string options, message;
};

// Each of `bad` (added to the fused run, or to the disaggregated one when it names --mode) stops
// every rank with exit code 2 and its message, before the run directory `dir` exists.
inline void expect_stops_before_output(const std::vector<BadOptions>& bad, const std::string& dir) {
  for (const BadOptions& b : bad) {
    SCOPED_TRACE(b.options);
    const bool fused = b.options.find("--mode") == std::string::npos;
    const CommandResult r = run_rlfusion(
        (fused ? kModelParallelFusedRun : kModelParallelRun) + b.options + " --run-dir " + dir,
        b.ranks);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(b.message), std::string::npos) << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}

}  // namespace rlf::test
