#include "src/rl/policy_loss.h"

#include <algorithm>

#include "kernels/arena.h"

namespace rlf {

namespace {

// Logits divided by the sampling temperature, as the sampler saw them (in place).
void apply_temperature(float* logits, int64_t count, float temperature) {
  if (temperature == 1.0f || temperature <= 0.0f) return;
  const float inverse = 1.0f / temperature;
  for (int64_t i = 0; i < count; ++i) logits[i] *= inverse;
}

// The decoupled objective's proximal log-probs of `rollout`: attached ones, or, when none are,
// the ones this forward just computed (the weights have not moved since the step began).
// Coupled: none (the behaviour log-probs anchor the trust region).
const float* proximal_anchor(const Rollout& rollout, const PpoSettings& settings,
                             const float* current) {
  if (!settings.decoupled) return nullptr;
  return rollout.proximal_logp.empty() ? current : rollout.proximal_logp.data();
}

}  // namespace

PackedRollouts pack_rollouts(const std::vector<const Rollout*>& rollouts) {
  PackedRollouts p;
  for (const Rollout* r : rollouts) {
    std::vector<int> sequence = r->prompt;
    sequence.insert(sequence.end(), r->response.begin(), r->response.end());
    p.response_rows.push_back(int(p.inputs.size()) + int(r->prompt.size()) - 1);
    for (size_t t = 0; t + 1 < sequence.size(); ++t) {
      p.inputs.push_back(sequence[t]);
      p.targets.push_back(sequence[t + 1]);
    }
    p.offsets.push_back(int(p.inputs.size()));
  }
  return p;
}

std::vector<std::vector<float>> response_logprobs_from_logits(
    const Ops<float>& ops, Arena& arena, const float* logits, int V, const PackedRollouts& p,
    const std::vector<const Rollout*>& rollouts, float temperature) {
  const int N = int(p.inputs.size());
  float* scaled = arena.allocate<float>(size_t(N) * V, "log-prob work");
  std::copy_n(logits, int64_t(N) * V, scaled);
  apply_temperature(scaled, int64_t(N) * V, temperature);
  float* logp = arena.allocate<float>(size_t(N), "log-prob work");
  float* lse = arena.allocate<float>(size_t(N), "log-prob work");
  ops.logprob_forward(logp, lse, scaled, p.targets.data(), N, V, arena);
  std::vector<std::vector<float>> out;
  for (size_t r = 0; r < rollouts.size(); ++r) {
    const float* first = logp + p.response_rows[r];
    out.emplace_back(first, first + rollouts[r]->response.size());
  }
  return out;
}

std::vector<std::vector<float>> response_logprobs(Transformer<float>& model,
                                                  const std::vector<const Rollout*>& rollouts,
                                                  float temperature) {
  const PackedRollouts p = pack_rollouts(rollouts);
  const float* logits = model.forward(p.inputs.data(), p.offsets.data(), int(rollouts.size()));
  // Work buffers sit above the activations and go with them.
  auto out = response_logprobs_from_logits(model.ops(), model.device(), logits,
                                           model.config().vocab_size, p, rollouts, temperature);
  model.release_activations();
  return out;
}

PpoStats policy_loss_gradient(const Ops<float>& ops, Arena& arena, const float* logits, int V,
                              const PackedRollouts& p, const std::vector<const Rollout*>& rollouts,
                              double normalizer, float temperature, const PpoSettings& settings,
                              float* dlogits) {
  const int N = int(p.inputs.size());
  float* scaled = arena.allocate<float>(size_t(N) * V, "policy loss work");
  std::copy_n(logits, int64_t(N) * V, scaled);
  apply_temperature(scaled, int64_t(N) * V, temperature);
  float* logp = arena.allocate<float>(size_t(N), "policy loss work");
  float* lse = arena.allocate<float>(size_t(N), "policy loss work");
  ops.logprob_forward(logp, lse, scaled, p.targets.data(), N, V, arena);

  float* dlogp = arena.allocate_zeroed<float>(size_t(N), "policy loss work");
  PpoStats total;
  for (size_t r = 0; r < rollouts.size(); ++r) {
    const Rollout& rollout = *rollouts[r];
    const int T = int(rollout.response.size());
    const std::vector<float> advantage(size_t(T), float(rollout.advantage));
    const int row = p.response_rows[r];
    const PpoStats s = ppo_clip_loss(logp + row, rollout.behaviour_logp.data(),
                                     settings.kl_coef > 0 ? rollout.reference_logp.data() : nullptr,
                                     advantage.data(), T, normalizer, settings, dlogp + row,
                                     proximal_anchor(rollout, settings, logp + row));
    total.loss += s.loss;
    total.clipped_tokens += s.clipped_tokens;
    total.kl_sum += s.kl_sum;
    total.ratio_sum += s.ratio_sum;
  }
  ops.logprob_backward(dlogits, dlogp, scaled, lse, p.targets.data(), N, V, arena);
  // d(logits / T) / d(logits) = 1 / T.
  apply_temperature(dlogits, int64_t(N) * V, temperature);
  return total;
}

PpoStats accumulate_policy_gradient(Transformer<float>& policy,
                                    const std::vector<const Rollout*>& rollouts, double normalizer,
                                    float temperature, const PpoSettings& settings,
                                    float aux_weight) {
  const PackedRollouts p = pack_rollouts(rollouts);
  const int N = int(p.inputs.size()), V = policy.config().vocab_size;
  Arena& device = policy.device();
  const float* logits = policy.forward(p.inputs.data(), p.offsets.data(), int(rollouts.size()));
  // Work buffers sit above the activations and are released with them by backward().
  float* dlogits = device.allocate_zeroed<float>(size_t(N) * V, "policy loss work");
  const PpoStats total = policy_loss_gradient(policy.ops(), device, logits, V, p, rollouts,
                                              normalizer, temperature, settings, dlogits);
  policy.backward(dlogits, aux_weight);
  return total;
}

}  // namespace rlf
