// Expert load prediction from recent router statistics: per expert, Holt's linear trend (an
// exponential moving average of the level plus one of its slope). beta = 0 is a plain EMA. Cheap
// enough for every step: O(experts) per observation.
#pragma once

#include <vector>

namespace rlf {

struct LoadPredictorOptions {
  double level_smoothing = 0.3;  // alpha in (0, 1]: weight of the newest step in the level
  double trend_smoothing = 0.1;  // beta in [0, 1]: weight of the newest slope in the trend (0: EMA)

  // ConfigError naming the option when a value lies outside its range.
  void validate() const;
};

class LoadPredictor {
 public:
  LoadPredictor(int experts, LoadPredictorOptions options);

  // One step's router statistics: tokens routed to each expert (size = experts).
  void observe(const std::vector<double>& tokens_per_expert);

  // Mean predicted load of each expert over the next `horizon` steps (>= 1): the level plus the
  // trend at the horizon's midpoint, never negative. Before any observation: all zero.
  std::vector<double> predict(int horizon) const;

  int steps_observed() const { return steps_; }
  // The state, for checkpoints: restore(level(), trend(), steps_observed()) on a predictor of the
  // same experts and options continues exactly where this one stands. ConfigError for arrays of
  // another size or a negative step count.
  const std::vector<double>& level() const { return level_; }
  const std::vector<double>& trend() const { return trend_; }
  void restore(const std::vector<double>& level, const std::vector<double>& trend, int steps);

 private:
  LoadPredictorOptions options_;
  std::vector<double> level_, trend_;
  int steps_ = 0;
};

}  // namespace rlf
