// A learned reward for rollouts: reward = W * verifier score + (1 - W) * programmatic reward,
// W in [0, 1] (1: only the learned reward model, 0: only the task's check). The verifier reads
// the whole sequence, <bos> prompt response (with <eos> when the policy ended).
#pragma once

#include <vector>

#include "src/model/reward_model.h"
#include "src/rl/rollout.h"

namespace rlf {

class RolloutReward {
 public:
  // `batch` sequences per verifier forward (memory only). Not owned.
  RolloutReward(RewardModel<float>& model, double blend, int batch)
      : model_(model), blend_(blend), batch_(batch) {}

  double blend() const { return blend_; }
  // Replaces each rollout's programmatic reward (already in r.reward) by the blend.
  void blend_into(std::vector<Rollout>& rollouts);

 private:
  RewardModel<float>& model_;
  double blend_;
  int batch_;
};

}  // namespace rlf
