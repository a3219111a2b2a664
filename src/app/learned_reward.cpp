#include "src/app/learned_reward.h"

#include <cstdio>

#include "kernels/device.h"
#include "kernels/error.h"
#include "src/io/parameter_file.h"
#include "src/io/reward_model_file.h"

namespace rlf {

void validate_reward_model(const RlOptions& rl, const Task& task) {
  if (rl.reward_model.empty()) return;
  check_parameter_file_kind(rl.reward_model, ParameterFileKind::RewardModel);
  check_model_fits_task(parameter_file_model(rl.reward_model), task,
                        "reward model '" + rl.reward_model + "'");
}

std::unique_ptr<LearnedReward> load_learned_reward(const RlOptions& rl, const Ops<float>& ops,
                                                   Arena* device, size_t host_capacity) {
  if (rl.reward_model.empty()) return nullptr;
  auto learned = std::make_unique<LearnedReward>();
  if (!device) {
    // Memory the ops can run on: host memory for the CPU kernels, managed memory for CUDA.
    learned->host_memory = std::make_unique<Arena>("reward model (host memory)", host_capacity,
                                                   Device::memory_kind_for(ops.backend));
  }
  Arena& memory = device ? *device : *learned->host_memory;
  learned->model = std::make_unique<RewardModel<float>>(parameter_file_model(rl.reward_model), ops,
                                                        memory, /*with_gradients=*/false);
  load_reward_model(rl.reward_model, *learned->model);
  learned->reward =
      std::make_unique<RolloutReward>(*learned->model, rl.reward_blend, rl.micro_batch);
  learned->placement = device ? "the device arena (with the policy)" : "a host arena of its own";
  return learned;
}

std::string describe_learned_reward(const RlOptions& rl, const LearnedReward* learned) {
  if (!learned) return "";
  char line[1024];
  std::snprintf(line, sizeof line,
                "# reward: %.2f x learned reward model %s (%s, %.2fM parameters, %s) + %.2f x the "
                "task's reward\n",
                rl.reward_blend, rl.reward_model.c_str(), learned->model->config().name.c_str(),
                learned->model->parameter_count() / 1e6,
                (format_bytes(reward_model_parameter_bytes(learned->model->config())) + " in " +
                 learned->placement)
                    .c_str(),
                1.0 - rl.reward_blend);
  return line;
}

std::string reward_json(const RlOptions& rl) {
  if (rl.reward_model.empty()) return "\"reward\":\"task\",";
  char fields[1024];
  std::snprintf(fields, sizeof fields,
                "\"reward\":\"learned\",\"reward_model\":\"%s\",\"reward_blend\":%.4f,",
                rl.reward_model.c_str(), rl.reward_blend);
  return fields;
}

}  // namespace rlf
