#include "src/rl/rollout.h"

#include "src/rl/rollout_reward.h"
#include "src/rl/tokenizer.h"

namespace rlf {

std::vector<int> prompt_tokens(const TaskSample& sample) {
  std::vector<int> tokens{Tokenizer::kBos};
  const std::vector<int> text = Tokenizer::encode(sample.prompt);
  tokens.insert(tokens.end(), text.begin(), text.end());
  return tokens;
}

void score_rollouts(const Task& task, int group_size, AdvantageEstimator estimator,
                    std::vector<Rollout>& rollouts, RolloutReward* learned) {
  std::vector<double> rewards(rollouts.size()), advantages(rollouts.size());
  for (Rollout& r : rollouts) r.reward = task.reward(r.task_sample, Tokenizer::decode(r.response));
  if (learned) learned->blend_into(rollouts);
  for (size_t i = 0; i < rollouts.size(); ++i) rewards[i] = rollouts[i].reward;
  compute_advantages(rewards.data(), int(rollouts.size()) / group_size, group_size, estimator, 1e-6,
                     advantages.data());
  for (size_t i = 0; i < rollouts.size(); ++i) rollouts[i].advantage = advantages[i];
}

std::vector<Rollout> generate_rollouts(Transformer<float>& policy, const Task& task,
                                       int64_t first_prompt, int prompts, int group_size,
                                       const GenerationSettings& settings, int version,
                                       AdvantageEstimator estimator, RolloutReward* learned,
                                       BatchOccupancy* occupancy) {
  const SampleGenerator from_policy =
      [&policy, &settings](const std::vector<std::vector<int>>& generation_prompts,
                           const std::vector<int64_t>& sample_ids, BatchOccupancy* steps) {
        return generate(policy, generation_prompts, sample_ids, settings, steps);
      };
  return generate_rollouts(from_policy, task, first_prompt, prompts, group_size, version, estimator,
                           learned, occupancy);
}

std::vector<Rollout> generate_rollouts(const SampleGenerator& generate_samples, const Task& task,
                                       int64_t first_prompt, int prompts, int group_size,
                                       int version, AdvantageEstimator estimator,
                                       RolloutReward* learned, BatchOccupancy* occupancy) {
  std::vector<Rollout> rollouts;
  std::vector<std::vector<int>> generation_prompts;
  std::vector<int64_t> sample_ids;
  for (int p = 0; p < prompts; ++p) {
    const TaskSample sample = task.train_sample(first_prompt + p);
    const std::vector<int> tokens = prompt_tokens(sample);
    for (int g = 0; g < group_size; ++g) {
      Rollout r;
      // One random stream per (prompt, member of its group), unique across the whole run.
      r.sample_id = (first_prompt + p) * group_size + g;
      r.task_sample = sample;
      r.prompt = tokens;
      r.version_min = r.version_max = version;
      generation_prompts.push_back(tokens);
      sample_ids.push_back(r.sample_id);
      rollouts.push_back(std::move(r));
    }
  }
  const std::vector<GeneratedSample> generated =
      generate_samples(generation_prompts, sample_ids, occupancy);
  for (size_t i = 0; i < rollouts.size(); ++i) {
    rollouts[i].response = generated[i].tokens;
    rollouts[i].behaviour_logp = generated[i].logprobs;
  }
  score_rollouts(task, group_size, estimator, rollouts, learned);
  return rollouts;
}

}  // namespace rlf
