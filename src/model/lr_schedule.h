// Learning-rate schedule: linear warm-up to the peak, then cosine decay to a floor.
#pragma once

#include <algorithm>
#include <cmath>

namespace rlf {

// step counts from 1; total_steps >= 1. Returns peak * factor, factor in [final_fraction, 1].
inline float cosine_learning_rate(float peak, int step, int warmup_steps, int total_steps,
                                  float final_fraction) {
  if (warmup_steps > 0 && step <= warmup_steps) return peak * float(step) / float(warmup_steps);
  const int decay_steps = std::max(1, total_steps - warmup_steps);
  const double progress = std::clamp(double(step - warmup_steps) / decay_steps, 0.0, 1.0);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return float(peak * (final_fraction + (1.0 - final_fraction) * cosine));
}

}  // namespace rlf
