#include "src/rl/ppo.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/error.h"

namespace rlf {

AdvantageEstimator parse_advantage_estimator(const std::string& name) {
  if (name == "grpo") return AdvantageEstimator::Grpo;
  if (name == "rloo") return AdvantageEstimator::Rloo;
  throw ConfigError("--advantage must be 'grpo' or 'rloo', got '" + name + "'");
}

void compute_advantages(const double* rewards, int groups, int group_size,
                        AdvantageEstimator estimator, double eps, double* advantages) {
  if (group_size < 2) throw std::invalid_argument("compute_advantages: group_size must be >= 2");
  for (int g = 0; g < groups; ++g) {
    const double* r = rewards + int64_t(g) * group_size;
    double* a = advantages + int64_t(g) * group_size;
    double sum = 0;
    for (int i = 0; i < group_size; ++i) sum += r[i];
    const double mean = sum / group_size;
    if (estimator == AdvantageEstimator::Rloo) {
      for (int i = 0; i < group_size; ++i) a[i] = r[i] - (sum - r[i]) / (group_size - 1);
      continue;
    }
    double squares = 0;
    for (int i = 0; i < group_size; ++i) squares += (r[i] - mean) * (r[i] - mean);
    const double std = std::sqrt(squares / group_size);
    for (int i = 0; i < group_size; ++i) a[i] = (r[i] - mean) / (std + eps);
  }
}

PpoStats ppo_clip_loss(const float* new_logp, const float* old_logp, const float* ref_logp,
                       const float* advantages, int T, double normalizer,
                       const PpoSettings& settings, float* dnew_logp, const float* prox_logp) {
  if (settings.kl_coef > 0 && !ref_logp) {
    throw std::invalid_argument("ppo_clip_loss: kl_coef > 0 needs reference log-probs");
  }
  PpoStats stats;
  const double lo = 1.0 - settings.clip_epsilon, hi = 1.0 + settings.clip_epsilon;
  for (int t = 0; t < T; ++t) {
    const double anchor = prox_logp ? double(prox_logp[t]) : double(old_logp[t]);
    const double ratio = std::exp(double(new_logp[t]) - anchor);
    const double weight =
        prox_logp ? std::min(std::exp(anchor - double(old_logp[t])), settings.importance_cap) : 1.0;
    const double a = advantages[t];
    const double unclipped = ratio * a, clipped = std::clamp(ratio, lo, hi) * a;
    // -min(unclipped, clipped): the clipped branch is constant in new_logp when it is active
    // and the ratio lies outside the clip range.
    const bool clip_active = clipped < unclipped && (ratio < lo || ratio > hi);
    double term = -weight * std::min(unclipped, clipped);
    // d(-w ratio a)/d(new) = -w ratio a (w depends on the proximal policy only).
    double grad = clip_active ? 0.0 : -weight * unclipped;
    stats.clipped_tokens += clip_active;
    stats.ratio_sum += ratio;
    if (settings.kl_coef > 0) {
      const double log_ref_over_new = double(ref_logp[t]) - double(new_logp[t]);
      const double k3 = std::exp(log_ref_over_new) - log_ref_over_new - 1.0;
      term += settings.kl_coef * k3;
      // d(k3)/d(new) = -exp(ref - new) + 1
      grad += settings.kl_coef * (1.0 - std::exp(log_ref_over_new));
      stats.kl_sum += k3;
    }
    stats.loss += term / normalizer;
    if (dnew_logp) dnew_logp[t] += float(grad / normalizer);
  }
  return stats;
}

}  // namespace rlf
