// `train --reward-model PATH --reward-blend W`: the learned reward model's checks before any work
// and its placement. In --mode fused-all it lives in the policy's device arena (and the fused
// memory plan counts it); everywhere else (one-rank train, the actors of a disaggregated run,
// --mode fused) in a host arena of its own.
#pragma once

#include <memory>
#include <string>

#include "kernels/arena.h"
#include "src/app/policy_setup.h"
#include "src/app/rl_options.h"
#include "src/model/reward_model.h"
#include "src/rl/rollout_reward.h"

namespace rlf {

struct LearnedReward {
  std::unique_ptr<Arena> host_memory;  // null when it lives in the policy's device arena
  std::unique_ptr<RewardModel<float>> model;
  std::unique_ptr<RolloutReward> reward;
  std::string placement;  // for the log: which arena holds it
};

// Without --reward-model nothing; otherwise ConfigError (on every rank, before any work) unless
// the file holds a reward model whose shape fits the task (vocabulary, sequence length).
void validate_reward_model(const RlOptions& rl, const Task& task);

// The reward model of --reward-model in `device`, or with device == null in a host arena of
// `host_capacity` bytes; null without --reward-model. Scores `rl.micro_batch` rollouts per
// forward.
std::unique_ptr<LearnedReward> load_learned_reward(const RlOptions& rl, const Ops<float>& ops,
                                                   Arena* device, size_t host_capacity);

// The RolloutReward of `learned`, or null (generate_rollouts' argument).
inline RolloutReward* rollout_reward(const std::unique_ptr<LearnedReward>& learned) {
  return learned ? learned->reward.get() : nullptr;
}

// One log line: the file, its size, where it lives and the blend ("" without a reward model).
std::string describe_learned_reward(const RlOptions& rl, const LearnedReward* learned);

// The summary.json fields of the reward, each followed by a comma: "reward":"task" or
// "reward":"learned","reward_model":"PATH","reward_blend":W.
std::string reward_json(const RlOptions& rl);

}  // namespace rlf
