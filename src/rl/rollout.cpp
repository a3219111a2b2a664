#include "src/rl/rollout.h"

#include "src/rl/rollout_reward.h"
#include "src/rl/tokenizer.h"

namespace rlf {

std::vector<Rollout> generate_rollouts(Transformer<float>& policy, const Task& task,
                                       int64_t first_prompt, int prompts, int group_size,
                                       const GenerationSettings& settings, int version,
                                       AdvantageEstimator estimator, RolloutReward* learned) {
  std::vector<Rollout> rollouts;
  std::vector<std::vector<int>> prompt_tokens;
  std::vector<int64_t> sample_ids;
  for (int p = 0; p < prompts; ++p) {
    const TaskSample sample = task.train_sample(first_prompt + p);
    std::vector<int> tokens{Tokenizer::kBos};
    const std::vector<int> text = Tokenizer::encode(sample.prompt);
    tokens.insert(tokens.end(), text.begin(), text.end());
    for (int g = 0; g < group_size; ++g) {
      Rollout r;
      // One random stream per (prompt, member of its group), unique across the whole run.
      r.sample_id = (first_prompt + p) * group_size + g;
      r.task_sample = sample;
      r.prompt = tokens;
      r.version = version;
      prompt_tokens.push_back(tokens);
      sample_ids.push_back(r.sample_id);
      rollouts.push_back(std::move(r));
    }
  }
  const std::vector<GeneratedSample> generated =
      generate(policy, prompt_tokens, sample_ids, settings);
  std::vector<double> rewards(rollouts.size()), advantages(rollouts.size());
  for (size_t i = 0; i < rollouts.size(); ++i) {
    Rollout& r = rollouts[i];
    r.response = generated[i].tokens;
    r.behaviour_logp = generated[i].logprobs;
    r.reward = task.reward(r.task_sample, Tokenizer::decode(r.response));
  }
  if (learned) learned->blend_into(rollouts);
  for (size_t i = 0; i < rollouts.size(); ++i) rewards[i] = rollouts[i].reward;
  compute_advantages(rewards.data(), prompts, group_size, estimator, 1e-6, advantages.data());
  for (size_t i = 0; i < rollouts.size(); ++i) rollouts[i].advantage = advantages[i];
  return rollouts;
}

}  // namespace rlf
