// The policy-gradient pass over rollouts: pack prompt + response back to back (no padding),
// forward the policy, take each response token's log-prob (at the sampling temperature), apply
// the PPO-clip objective, and backpropagate into the model's gradients.
#pragma once

#include <vector>

#include "src/model/transformer.h"
#include "src/rl/ppo.h"
#include "src/rl/rollout.h"

namespace rlf {

// Packed next-token batch: inputs = sequence[:-1], targets = sequence[1:]; response token t of
// rollout r is predicted at row response_rows[r] + t.
struct PackedRollouts {
  std::vector<int> inputs, targets, offsets{0}, response_rows;
};
PackedRollouts pack_rollouts(const std::vector<const Rollout*>& rollouts);

// The PPO-clip loss of `rollouts` (packed as `packed`) from the policy's `logits` [N, V]: adds
// d(loss) / d(logits) into `dlogits` (N x V, zeroed by the caller). Work buffers come from `arena`
// and stay allocated (the caller releases them with the activations). Divided by `normalizer` as
// below.
PpoStats policy_loss_gradient(const Ops<float>& ops, Arena& arena, const float* logits, int V,
                              const PackedRollouts& packed,
                              const std::vector<const Rollout*>& rollouts, double normalizer,
                              float temperature, const PpoSettings& settings, float* dlogits);

// Log-probs of every rollout's response tokens (packed as `packed`) from a model's `logits` [N, V]
// at `temperature`, per rollout; work buffers from `arena` stay allocated (as above).
std::vector<std::vector<float>> response_logprobs_from_logits(
    const Ops<float>& ops, Arena& arena, const float* logits, int V, const PackedRollouts& packed,
    const std::vector<const Rollout*>& rollouts, float temperature);
// Log-probs of every rollout's response tokens under `model` (forward only), per rollout.
std::vector<std::vector<float>> response_logprobs(Transformer<float>& model,
                                                  const std::vector<const Rollout*>& rollouts,
                                                  float temperature);

// Adds the gradient of the PPO-clip loss of `rollouts` into policy.gradients(). The loss is
// divided by `normalizer` (the response-token count of the whole optimizer step, so that
// micro-batches and data-parallel shards add up to the same gradient); aux_weight scales the
// routers' load-balancing loss of this micro-batch (0: none).
PpoStats accumulate_policy_gradient(Transformer<float>& policy,
                                    const std::vector<const Rollout*>& rollouts, double normalizer,
                                    float temperature, const PpoSettings& settings,
                                    float aux_weight);

}  // namespace rlf
