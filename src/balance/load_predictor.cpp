#include "src/balance/load_predictor.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/error.h"

namespace rlf {

void LoadPredictorOptions::validate() const {
  if (!(level_smoothing > 0 && level_smoothing <= 1)) {
    throw ConfigError("--level-smoothing must be in (0, 1], got " +
                      std::to_string(level_smoothing));
  }
  if (!(trend_smoothing >= 0 && trend_smoothing <= 1)) {
    throw ConfigError("--trend-smoothing must be in [0, 1], got " +
                      std::to_string(trend_smoothing));
  }
}

LoadPredictor::LoadPredictor(int experts, LoadPredictorOptions options)
    : options_(options), level_(size_t(std::max(experts, 0))), trend_(level_.size()) {
  options_.validate();
  if (experts < 1) throw ConfigError("load predictor: experts must be >= 1");
}

void LoadPredictor::observe(const std::vector<double>& tokens_per_expert) {
  if (tokens_per_expert.size() != level_.size()) {
    throw ConfigError("load predictor: " + std::to_string(tokens_per_expert.size()) +
                      " expert loads for " + std::to_string(level_.size()) + " experts");
  }
  const double alpha = options_.level_smoothing, beta = options_.trend_smoothing;
  for (size_t e = 0; e < level_.size(); ++e) {
    const double x = tokens_per_expert[e];
    if (steps_ == 0) {  // the first observation is the level; no slope is known yet
      level_[e] = x;
      continue;
    }
    const double previous = level_[e];
    level_[e] = alpha * x + (1 - alpha) * (previous + trend_[e]);
    trend_[e] = beta * (level_[e] - previous) + (1 - beta) * trend_[e];
  }
  ++steps_;
}

void LoadPredictor::restore(const std::vector<double>& level, const std::vector<double>& trend,
                            int steps) {
  if (level.size() != level_.size() || trend.size() != trend_.size() || steps < 0) {
    throw ConfigError("load predictor: a saved state of " + std::to_string(level.size()) +
                      " experts and " + std::to_string(steps) + " steps for " +
                      std::to_string(level_.size()) + " experts");
  }
  level_ = level;
  trend_ = trend;
  steps_ = steps;
}

std::vector<double> LoadPredictor::predict(int horizon) const {
  if (horizon < 1) throw ConfigError("--horizon must be >= 1, got " + std::to_string(horizon));
  std::vector<double> out(level_.size());
  // The mean of level + trend * h over h = 1 .. horizon.
  const double midpoint = 0.5 * (horizon + 1);
  for (size_t e = 0; e < out.size(); ++e) out[e] = std::max(0.0, level_[e] + trend_[e] * midpoint);
  return out;
}

}  // namespace rlf
