// Rollouts: G responses per prompt from the current policy, with every response token's
// behaviour log-prob and the policy version that produced it, then rewards and advantages.
#pragma once

#include <cstdint>
#include <functional>
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
  // Per response token, the policy at the start of the training step: the decoupled objective's
  // trust-region anchor for stale samples (empty: the behaviour log-probs anchor it).
  std::vector<float> proximal_logp;
  // Oldest and newest policy version that produced any of its tokens: equal for a rollout
  // generated in one go, apart for a partial rollout resumed under newer weights (StaleSync).
  int version_min = 0;
  int version_max = 0;
  double reward = 0;
  double advantage = 0;
};

// <bos> + the encoded prompt text: what the policy is prompted with.
std::vector<int> prompt_tokens(const TaskSample& sample);

// Fills every rollout's reward (task.reward on its decoded response) and advantage (over each run
// of group_size consecutive rollouts, one prompt's group).
// A learned reward, when given, is blended into the task's before the advantages.
void score_rollouts(const Task& task, int group_size, AdvantageEstimator estimator,
                    std::vector<Rollout>& rollouts, RolloutReward* learned = nullptr);

// Generates group_size responses for each of `prompts` training prompts starting at
// first_prompt (task.train_sample(first_prompt + p)), scores them with the task's reward (blended
// with a learned reward model when `learned` is given) and fills advantages. `occupancy`: see
// generate().
std::vector<Rollout> generate_rollouts(Transformer<float>& policy, const Task& task,
                                       int64_t first_prompt, int prompts, int group_size,
                                       const GenerationSettings& settings, int version,
                                       AdvantageEstimator estimator,
                                       RolloutReward* learned = nullptr,
                                       BatchOccupancy* occupancy = nullptr);

// What draws the samples of prompts (with their sample ids): generate() on a model, or a
// collective generator such as a pipeline's (src/runtime/pipeline_generation.h).
using SampleGenerator = std::function<std::vector<GeneratedSample>(
    const std::vector<std::vector<int>>& prompts, const std::vector<int64_t>& sample_ids,
    BatchOccupancy* occupancy)>;
// The same with the samples drawn by `generate_samples`.
std::vector<Rollout> generate_rollouts(const SampleGenerator& generate_samples, const Task& task,
                                       int64_t first_prompt, int prompts, int group_size,
                                       int version, AdvantageEstimator estimator,
                                       RolloutReward* learned = nullptr,
                                       BatchOccupancy* occupancy = nullptr);

}  // namespace rlf
