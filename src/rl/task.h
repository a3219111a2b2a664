// Tasks with verifiable rewards. A task turns a sample id into a prompt and a reference answer
// (a pure function of the task's seed and the id), and scores a response exactly. Training ids
// are [0, kHeldOutBase) and held-out ids [kHeldOutBase, ...), so the two sets never overlap.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace rlf {

struct TaskSample {
  int64_t id = 0;
  std::string prompt;  // text after <bos>, e.g. "123+45="
  std::string answer;  // reference response text (the demonstration for SFT), e.g. "168"
};

// Task settings: the `[task]` section of an INI file in inputs/tasks/ plus the seed.
struct TaskConfig {
  std::string name;  // add | sort | long-add | ...
  uint64_t seed = 1;
  std::map<std::string, std::string> params;  // task-specific keys (min_digits, ...)
};

class Task {
 public:
  static constexpr int64_t kHeldOutBase = int64_t(1) << 40;

  virtual ~Task() = default;
  virtual std::string name() const = 0;
  virtual TaskSample sample(int64_t id) const = 0;
  // Reward of a response (its text, without <eos>), in [0, 1]: 1 exactly when the final answer
  // is correct; a well-formed but wrong answer may earn the task's format credit.
  virtual double reward(const TaskSample& sample, std::string_view response) const = 0;
  // Longest prompt and response (in characters) this task can produce: sizes KV caches and
  // checks the model's max_seq_len before any work.
  virtual int max_prompt_chars() const = 0;
  virtual int max_response_chars() const = 0;

  bool correct(const TaskSample& s, std::string_view response) const {
    return reward(s, response) >= 1.0;
  }
  TaskSample train_sample(int64_t index) const { return sample(index); }
  TaskSample heldout_sample(int64_t index) const { return sample(kHeldOutBase + index); }
};

// Builds a task from its config; ConfigError for an unknown task name or a bad parameter
// (naming the key and the expected value).
std::unique_ptr<Task> make_task(const TaskConfig& config);
// Reads inputs/tasks/<name>.ini (or a path): `[task] name = ...` plus the task's keys.
TaskConfig load_task_config(const std::string& name_or_path, uint64_t seed);
// Names make_task accepts.
std::vector<std::string> task_names();

}  // namespace rlf
