#include "src/rl/sort_task.h"

#include <algorithm>
#include <cmath>

#include "src/rl/sample_draws.h"
#include "src/rl/task_params.h"

namespace rlf {

SortTask::SortTask(const TaskConfig& config) : seed_(config.seed) {
  const TaskParams params(
      config, {"length_distribution", "min_length", "max_length", "median_length", "sigma"});
  lognormal_ =
      params.choice("length_distribution", "uniform", {"uniform", "lognormal"}) == "lognormal";
  // A key of the other distribution would be silently ignored; reject it so that an INI file
  // always means what it says.
  for (const char* key : lognormal_ ? std::vector<const char*>{"min_length"}
                                    : std::vector<const char*>{"median_length", "sigma"}) {
    if (params.has(key)) {
      params.fail(std::string(key) + " does not apply to length_distribution = " +
                  (lognormal_ ? "lognormal" : "uniform"));
    }
  }
  if (lognormal_) {
    median_length_ = params.number(
        "median_length", 4.0, [](double x) { return x > 0 && x <= kMaxListLength; },
        "a number in (0, " + std::to_string(kMaxListLength) + "]");
    sigma_ = params.number(
        "sigma", 1.0, [](double x) { return x >= 0 && x <= 10; }, "a number in [0, 10]");
    max_length_ = params.integer("max_length", 48, 1, kMaxListLength);
  } else {
    min_length_ = params.integer("min_length", 2, 1, kMaxListLength);
    max_length_ = params.integer("max_length", std::max(6, min_length_), 1, kMaxListLength);
    if (max_length_ < min_length_) {
      params.fail(
          "max_length = " + std::to_string(max_length_) +
          " is invalid (expected an integer >= min_length = " + std::to_string(min_length_) + ")");
    }
  }
  format_reward_ = params.format_reward();
}

int SortTask::list_length(int64_t id) const {
  if (!lognormal_) return uniform_int(seed_, id, 0, min_length_, max_length_);
  // Clamp in floating point before rounding: exp(sigma * z) can exceed any integer type.
  const double length = median_length_ * std::exp(sigma_ * philox_normal(seed_, uint64_t(id), 0));
  return int(std::lround(std::clamp(length, 1.0, double(max_length_))));
}

TaskSample SortTask::sample(int64_t id) const {
  const int length = list_length(id);
  std::string digits;
  for (int i = 0; i < length; ++i) digits.push_back(random_digit(seed_, id, uint64_t(1 + i)));
  std::string sorted = digits;
  std::sort(sorted.begin(), sorted.end());
  return {id, digits + ">", sorted};
}

double SortTask::reward(const TaskSample& sample, std::string_view response) const {
  // Well-formed: a list of one to max_length digits (the answer's own shape, unsorted or not).
  const bool well_formed =
      !response.empty() && response.size() <= size_t(max_length_) &&
      std::all_of(response.begin(), response.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!well_formed) return 0;
  return response == sample.answer ? 1.0 : format_reward_;
}

}  // namespace rlf
