// The RL math of one step, independent of the model: group-relative advantages and the PPO-clip
// objective with an optional KL penalty to a reference policy.
#pragma once

#include <string>

namespace rlf {

enum class AdvantageEstimator { Grpo, Rloo };
AdvantageEstimator parse_advantage_estimator(const std::string& name);  // "grpo" | "rloo"

// rewards[groups * group_size], the samples of a prompt consecutive. Writes advantages:
//   GRPO: (r_i - mean(group)) / (std(group) + eps), std the population standard deviation;
//   RLOO: r_i - mean of the other group_size - 1 rewards (leave-one-out baseline).
// group_size must be >= 2.
void compute_advantages(const double* rewards, int groups, int group_size,
                        AdvantageEstimator estimator, double eps, double* advantages);

struct PpoSettings {
  double clip_epsilon = 0.2;  // ratio clipped to [1 - eps, 1 + eps]
  double kl_coef = 0.0;       // weight of the k3 KL estimator; 0 disables the reference model
  // Decoupled objective only: the behaviour importance weight exp(prox - behaviour) is capped
  // here, so one token that the behaviour policy drew at very low probability cannot dominate.
  double importance_cap = 5.0;
  // StaleSync: anchor the trust region at the proximal policy (the decoupled objective below).
  bool decoupled = false;
};

struct PpoStats {
  double loss = 0;            // total objective (already divided by the normalizer)
  double clipped_tokens = 0;  // tokens whose clipped term was the active one with zero gradient
  double kl_sum = 0;          // sum over tokens of the k3 estimate (not normalized)
  double ratio_sum = 0;       // sum over tokens of the importance ratio
};

// Over T response tokens with per-token advantage A_t, behaviour log-prob old_t, current log-prob
// new_t and (when kl_coef > 0) reference log-prob ref_t:
//   r_t = exp(new_t - old_t)
//   loss = (1 / normalizer) * sum_t [ -min(r_t A_t, clip(r_t, 1-eps, 1+eps) A_t)
//                                      + kl_coef * (exp(ref_t - new_t) - (ref_t - new_t) - 1) ]
// The k3 estimator (Schulman, "Approximating KL divergence") is unbiased for KL(new || ref), and
// always >= 0. normalizer is the global count of response tokens of the step, so splitting the
// tokens across calls (or ranks) and adding the results gives the same loss and gradient.
// Adds d(loss)/d(new_t) into dnew_logp (when not null). ref_logp may be null when kl_coef == 0.
//
// Decoupled objective (StaleSync; Hilton et al., "Batch size-invariance for policy optimization",
// as AReaL uses it), when prox_logp is given: old_t is the behaviour log-prob of the (possibly
// stale, possibly several-version) policy that drew the token, prox_t the log-prob under the
// policy at the start of this training step. The trust region is taken around the proximal
// policy, and the behaviour mismatch is corrected by a capped importance weight:
//   r_t = exp(new_t - prox_t),  w_t = min(exp(prox_t - old_t), importance_cap)
//   loss = (1 / normalizer) * sum_t [ -w_t min(r_t A_t, clip(r_t, 1-eps, 1+eps) A_t) + KL term ]
// With fresh data prox == old, w = 1, and the loss is the coupled one above.
PpoStats ppo_clip_loss(const float* new_logp, const float* old_logp, const float* ref_logp,
                       const float* advantages, int T, double normalizer,
                       const PpoSettings& settings, float* dnew_logp,
                       const float* prox_logp = nullptr);

}  // namespace rlf
