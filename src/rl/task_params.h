// Strict reading of a task's string parameters (TaskConfig::params): every key must be one the
// task knows, every value must parse completely and lie in its range, and an absent key takes
// its default. Errors are ConfigErrors naming the task, the key, the value and what was expected,
// because these values come from user-edited INI files.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "src/rl/task.h"

namespace rlf {

class TaskParams {
 public:
  // Throws ConfigError when config.params holds a key outside `known_keys`.
  TaskParams(const TaskConfig& config, std::vector<std::string> known_keys);

  bool has(const std::string& key) const { return params_.count(key) != 0; }
  // An integer in [lo, hi].
  int integer(const std::string& key, int fallback, int lo, int hi) const;
  // A finite number for which `accept` holds; `expected` describes the range for the message.
  double number(const std::string& key, double fallback, bool (*accept)(double),
                const std::string& expected) const;
  // One of `options`, spelled exactly.
  std::string choice(const std::string& key, const std::string& fallback,
                     const std::vector<std::string>& options) const;
  // The reward of a well-formed but wrong response: a number in [0, 1), default 0, so that only
  // a correct answer can earn 1.
  double format_reward() const;

  // Throws ConfigError "task '<name>': <message>".
  [[noreturn]] void fail(const std::string& message) const;

  static constexpr const char* kFormatRewardKey = "format_reward";

 private:
  [[noreturn]] void fail_value(const std::string& key, const std::string& expected) const;

  std::string task_;
  std::map<std::string, std::string> params_;
};

}  // namespace rlf
