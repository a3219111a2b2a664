// `train --baseline disaggregated`: before the run itself, the same config (model, task, seed,
// SFT, samples per step) runs as synchronous disaggregated RL on the same ranks, into a sibling
// run directory (<run-dir>-baseline); the job ends with a table of both runs' tokens/s, RL time
// and held-out accuracy, and the speed-up of the run over the baseline. `make run` uses it to
// show what RL Fusion and StaleSync gain over the synchronous disaggregated deployment, measured
// in the same job.
#pragma once

#include <functional>
#include <string>

#include "src/app/disaggregated_train.h"
#include "src/app/policy_setup.h"
#include "src/app/rl_options.h"
#include "src/app/sft_phase.h"
#include "src/app/train_result.h"

namespace rlf {

// `describe_run` names the run in the table (e.g. "fused, StaleSync s=1"); `run_itself` runs it
// and fills its TrainResult. Collective over MPI_COMM_WORLD; returns run_itself's exit code.
int run_with_baseline(const RunOptions& run, const PolicyOptions& policy_options,
                      const SftSchedule& sft, const RlOptions& rl, const LayoutConfig& layout,
                      const DisaggregatedOptions& options, const std::string& describe_run,
                      const std::function<int(TrainResult*)>& run_itself);

}  // namespace rlf
