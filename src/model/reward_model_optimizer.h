// AdamW for a reward model: the body's AdamW (moments in the model's arena) and the head's
// moments, one global-norm clip over both.
#pragma once

#include "src/model/optimizer.h"
#include "src/model/reward_model.h"

namespace rlf {

class RewardModelOptimizer {
 public:
  RewardModelOptimizer(RewardModel<float>& model, const AdamWHyper& hyper, float max_grad_norm);

  // Clips the body's and the head's gradients together, updates both; returns the norm before
  // clipping.
  double step();
  void set_learning_rate(float learning_rate);

 private:
  RewardModel<float>& model_;
  float max_grad_norm_;
  AdamW<float> body_;  // clips nothing itself: step() has scaled the gradients already
  int step_ = 0;
};

}  // namespace rlf
