// `add`: prompt "<a>+<b>=", answer the decimal sum, e.g. "57+68=" -> "125". The operand helpers
// here are shared with `long-add`, which asks for the same sums with a worked answer.
#pragma once

#include <string>
#include <string_view>

#include "src/rl/task.h"
#include "src/rl/task_params.h"

namespace rlf {

// How many digits each operand has: drawn uniformly from [min_digits, max_digits] per operand.
struct OperandDigits {
  int min_digits = 1;
  int max_digits = 3;

  // Reads min_digits and max_digits (both in [1, kMaxOperandDigits], min <= max).
  static OperandDigits read(const TaskParams& params, int default_max_digits);
  static constexpr int kMaxOperandDigits = 30;
};

struct Operands {
  std::string a, b;  // decimal, no leading zeros ("0" itself is allowed)
};

Operands draw_operands(const OperandDigits& digits, uint64_t seed, int64_t id);
// Sum of two non-negative decimal numbers of any length.
std::string decimal_sum(std::string_view a, std::string_view b);
// One or more digits and no leading zero unless the number is "0": the only spelling of a
// number a response may use.
bool is_canonical_number(std::string_view text);

class AdditionTask : public Task {
 public:
  // Keys: min_digits (default 1), max_digits (default 3), format_reward (default 0).
  explicit AdditionTask(const TaskConfig& config);

  std::string name() const override { return "add"; }
  TaskSample sample(int64_t id) const override;
  double reward(const TaskSample& sample, std::string_view response) const override;
  int max_prompt_chars() const override { return 2 * digits_.max_digits + 2; }
  int max_response_chars() const override { return digits_.max_digits + 1; }

 private:
  uint64_t seed_;
  OperandDigits digits_;
  double format_reward_;
};

}  // namespace rlf
