// Rollouts: G responses per prompt from the current policy, with every response token's
// behaviour log-prob and the policy version that produced it, then rewards and advantages.
#pragma once

#include <cstdint>
#include <vector>

#include "src/model/generation.h"
#include "src/rl/ppo.h"
#include "src/rl/task.h"

namespace rlf {

class RolloutReward;

struct Rollout {
  int64_t sample_id = 0;  // keys the sampler's random stream
  TaskSample task_sample;
  std::vector<int> prompt;            // <bos> + prompt characters
  std::vector<int> response;          // response tokens (with <eos> when the policy ended)
  std::vector<float> behaviour_logp;  // per response token, at generation time
  std::vector<float> reference_logp;  // per response token, frozen reference (when KL is on)
  int version = 0;                    // policy version that generated every token
  double reward = 0;
  double advantage = 0;
};

// Generates group_size responses for each of `prompts` training prompts starting at
// first_prompt (task.train_sample(first_prompt + p)), scores them with the task's reward (blended
// with a learned reward model when `learned` is given) and fills advantages.
std::vector<Rollout> generate_rollouts(Transformer<float>& policy, const Task& task,
                                       int64_t first_prompt, int prompts, int group_size,
                                       const GenerationSettings& settings, int version,
                                       AdvantageEstimator estimator,
                                       RolloutReward* learned = nullptr);

}  // namespace rlf
