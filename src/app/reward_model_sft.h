// `rlfusion sft --reward-model`: trains a learned reward model (the policy's MoE body with a
// scalar head) on the task's labelled samples (reference answers and corrupted ones), writes it
// to model.h5 marked as a reward model, and reports held-out verifier accuracy.
#pragma once

#include <string>

#include "src/app/policy_setup.h"
#include "src/app/sft_phase.h"

namespace rlf {

int run_reward_model_sft(const RunOptions& run, const PolicyOptions& policy_options,
                         const SftSchedule& schedule, const std::string& resolved_config);

}  // namespace rlf
