#include "src/model/reward_model_optimizer.h"

#include <cmath>

namespace rlf {

RewardModelOptimizer::RewardModelOptimizer(RewardModel<float>& model, const AdamWHyper& hyper,
                                           float max_grad_norm)
    : model_(model), max_grad_norm_(max_grad_norm), body_(model.body(), hyper, 0.0f) {}

void RewardModelOptimizer::set_learning_rate(float learning_rate) {
  body_.hyper().learning_rate = learning_rate;
}

double RewardModelOptimizer::step() {
  Transformer<float>& body = model_.body();
  RewardHead<float>& head = model_.head();
  const Ops<float>& ops = body.ops();
  float* body_grads = body.gradients();
  const int64_t body_count = body.parameter_count(), head_count = head.parameter_count();
  const double norm = std::sqrt(ops.grad_norm_squared(body_grads, body_count, body.device()) +
                                ops.grad_norm_squared(head.gradients(), head_count, body.device()));
  const float scale = clip_scale(norm, max_grad_norm_);
  if (scale != 1.0f) {
    for (int64_t i = 0; i < body_count; ++i) body_grads[i] *= scale;
  }
  body_.step();
  ++step_;
  ops.adamw_update(head.parameters(), head.gradients(), head.first_moment(), head.second_moment(),
                   head_count, body_.hyper(), step_, scale, body.device());
  return norm;
}

}  // namespace rlf
