// `train --mode fused --offload` with model parallelism: TP 2 and PP 2 on 2 ranks, TP 2 x PP 2 and
// TP 2 x EP 2 on 4 ranks, and TP 2 and TP 4 on 4 ranks generating at a lower TP degree
// (--actor-tensor-parallel), and TP 2 x EP 2 x PP 2 on 8 ranks. Every rank's gradients and AdamW
// moments (its TP slice, its stage's) leave the device arena for each generation phase and come
// back in place for training, so the run equals the one without offload bit for bit (progress rows
// and the saved model), and rank 0's measured generation peak (deterministic arena accounting) is
// lower by exactly the bytes offloaded: three arena-aligned buffers of the parameters the rank
// stores.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "tests/app/fused_train_runs.h"
#include "tests/app/json_output.h"
#include "tests/app/progress_rows.h"
#include "tests/app/read_parameters.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

using Result = test::CommandResult;

// Short, with a KL term so that the frozen reference (a TP slice, a stage) stays in the arena
// below the offloaded state.
const std::string kRun =
    "train --model tiny --task sort --sft-steps 30 --sft-learning-rate 0.01 --steps 3 "
    "--prompts 8 --group-size 4 --eval-prompts 8 --kl-coef 0.05 --log-every 1 --json "
    "--mode fused ";

// summary.json's measured generation peak of rank 0, in bytes.
double generation_peak(const std::string& output) {
  return test::json_number(output, "generation", output.find("\"device_memory_peaks\""));
}

// The parameters rank 0 stores, from the model-parallel layouts' log lines.
long long stored_parameters(const std::string& output) {
  const std::string marker = "this rank stores ";
  const size_t at = output.find(marker);
  return at == std::string::npos ? -1 : std::stoll(output.substr(at + marker.size()));
}

TEST(ModelParallelOffload, EqualsTheRunWithoutOffloadAndLowersTheGenerationPeak) {
  struct Layout {
    int ranks;
    std::string options;
  };
  for (const Layout& layout :
       {Layout{2, "--tensor-parallel 2 "}, Layout{2, "--pipeline-parallel 2 "},
        Layout{4, "--tensor-parallel 2 --pipeline-parallel 2 "},
        Layout{4, "--tensor-parallel 2 --expert-parallel 2 "},
        // Generating data-parallel from the regrouped whole model (TP 2 x DP 2, then TP 4 at 2).
        Layout{4, "--tensor-parallel 2 --actor-tensor-parallel 1 "},
        Layout{4, "--tensor-parallel 4 --actor-tensor-parallel 2 "},
        Layout{8, "--tensor-parallel 2 --pipeline-parallel 2 --expert-parallel 2 "},
        // TP 4 x EP 2 generating at TP 2 (its training experts, over its training EP group).
        Layout{8, "--tensor-parallel 4 --expert-parallel 2 --actor-tensor-parallel 2 "}}) {
    SCOPED_TRACE(std::to_string(layout.ranks) + " ranks " + layout.options);
    const std::string plain_dir = test::fresh_temp_dir("mp-offload-plain");
    const std::string offload_dir = test::fresh_temp_dir("mp-offload");
    const Result plain =
        test::run_rlfusion(kRun + layout.options + "--run-dir " + plain_dir, layout.ranks);
    const Result offload = test::run_rlfusion(
        kRun + layout.options + "--offload --run-dir " + offload_dir, layout.ranks);
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    ASSERT_EQ(offload.exit_code, 0) << offload.output;
    EXPECT_NE(offload.output.find("of gradients and optimizer state leave device memory"),
              std::string::npos)
        << offload.output;
    const std::vector<std::vector<std::string>> rows = test::progress_rows(plain.output);
    ASSERT_EQ(rows.size(), 3u) << plain.output;
    EXPECT_EQ(test::progress_rows(offload.output), rows) << offload.output;
    EXPECT_EQ(test::read_saved_parameters(offload_dir + "/model.h5"),
              test::read_saved_parameters(plain_dir + "/model.h5"));
    // Rank 0 stores a TP slice or a stage (or both): fewer parameters than the whole model, and
    // generation drops by its gradients and two moments.
    const long long stored = stored_parameters(offload.output);
    ASSERT_GT(stored, 0) << offload.output;
    const double a = double(Arena::kAlignment);
    const double offloaded = 3 * std::ceil(double(stored) * sizeof(float) / a) * a;
    EXPECT_EQ(generation_peak(plain.output) - generation_peak(offload.output), offloaded)
        << plain.output << offload.output;
  }
}

}  // namespace
}  // namespace rlf
