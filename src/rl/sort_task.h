// `sort`: prompt a list of digits and '>', answer the digits in ascending order, e.g.
// "3142>" -> "1234". The list length follows `length_distribution`: uniform over
// [min_length, max_length], or lognormal (median_length, sigma, capped at max_length), which
// gives the heavy-tailed response lengths that long-tail rollout handling is tested against.
#pragma once

#include "src/rl/task.h"

namespace rlf {

class SortTask : public Task {
 public:
  // Keys: length_distribution (uniform | lognormal, default uniform); uniform: min_length
  // (default 2), max_length (default 6); lognormal: median_length (default 4), sigma (default 1),
  // max_length (default 48); format_reward (default 0).
  explicit SortTask(const TaskConfig& config);

  std::string name() const override { return "sort"; }
  TaskSample sample(int64_t id) const override;
  double reward(const TaskSample& sample, std::string_view response) const override;
  int max_prompt_chars() const override { return max_length_ + 1; }
  int max_response_chars() const override { return max_length_; }

  static constexpr int kMaxListLength = 1000;

 private:
  int list_length(int64_t id) const;

  uint64_t seed_;
  bool lognormal_ = false;
  int min_length_ = 2, max_length_ = 6;
  double median_length_ = 4, sigma_ = 1;
  double format_reward_ = 0;
};

}  // namespace rlf
