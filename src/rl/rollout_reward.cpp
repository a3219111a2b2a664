#include "src/rl/rollout_reward.h"

namespace rlf {

void RolloutReward::blend_into(std::vector<Rollout>& rollouts) {
  std::vector<std::vector<int>> sequences;
  sequences.reserve(rollouts.size());
  for (const Rollout& r : rollouts) {
    std::vector<int> tokens = r.prompt;
    tokens.insert(tokens.end(), r.response.begin(), r.response.end());
    sequences.push_back(std::move(tokens));
  }
  const std::vector<double> scores = model_.scores(sequences, batch_);
  for (size_t i = 0; i < rollouts.size(); ++i) {
    rollouts[i].reward = blend_ * scores[i] + (1.0 - blend_) * rollouts[i].reward;
  }
}

}  // namespace rlf
