// A learned reward model in a parameter file (src/io/parameter_file.h): the body's tensors as a
// policy's, the scalar head as reward_head.weight and reward_head.bias, and kind = reward-model.
#pragma once

#include <string>

#include "src/model/reward_model.h"

namespace rlf {

void save_reward_model(const std::string& path, RewardModel<float>& model);
// ConfigError if the file is missing, holds a policy, or does not match the model's shape.
void load_reward_model(const std::string& path, RewardModel<float>& model);

}  // namespace rlf
