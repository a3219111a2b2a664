#include "src/rl/task_params.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "kernels/error.h"

namespace rlf {

namespace {

std::string join(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& word : words) out += (out.empty() ? "" : ", ") + word;
  return out;
}

// from_chars over the whole string: "12abc", " 12" and "" are all rejected.
template <typename T>
bool parse_whole(const std::string& text, T& value) {
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  return error == std::errc() && stop == end && !text.empty();
}

}  // namespace

TaskParams::TaskParams(const TaskConfig& config, std::vector<std::string> known_keys)
    : task_(config.name), params_(config.params) {
  known_keys.push_back(kFormatRewardKey);
  std::vector<std::string> unknown;
  for (const auto& [key, value] : params_) {
    if (std::find(known_keys.begin(), known_keys.end(), key) == known_keys.end()) {
      unknown.push_back("'" + key + "'");
    }
  }
  if (!unknown.empty()) {
    std::sort(known_keys.begin(), known_keys.end());
    fail("unknown key" + std::string(unknown.size() > 1 ? "s " : " ") + join(unknown) +
         " (known keys: " + join(known_keys) + ")");
  }
}

void TaskParams::fail(const std::string& message) const {
  throw ConfigError("task '" + task_ + "': " + message);
}

void TaskParams::fail_value(const std::string& key, const std::string& expected) const {
  fail(key + " = '" + params_.at(key) + "' is invalid (expected " + expected + ")");
}

int TaskParams::integer(const std::string& key, int fallback, int lo, int hi) const {
  const auto it = params_.find(key);
  if (it == params_.end()) return fallback;
  int value = 0;
  if (!parse_whole(it->second, value) || value < lo || value > hi) {
    fail_value(key, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return value;
}

double TaskParams::number(const std::string& key, double fallback, bool (*accept)(double),
                          const std::string& expected) const {
  const auto it = params_.find(key);
  if (it == params_.end()) return fallback;
  double value = 0;
  if (!parse_whole(it->second, value) || !std::isfinite(value) || !accept(value)) {
    fail_value(key, expected);
  }
  return value;
}

std::string TaskParams::choice(const std::string& key, const std::string& fallback,
                               const std::vector<std::string>& options) const {
  const auto it = params_.find(key);
  if (it == params_.end()) return fallback;
  if (std::find(options.begin(), options.end(), it->second) == options.end()) {
    fail_value(key, "one of: " + join(options));
  }
  return it->second;
}

double TaskParams::format_reward() const {
  return number(
      kFormatRewardKey, 0.0, [](double x) { return x >= 0.0 && x < 1.0; }, "a number in [0, 1)");
}

}  // namespace rlf
