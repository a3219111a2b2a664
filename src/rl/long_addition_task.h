// `long-add`: the sums of `add` with a worked answer whose length grows with the operands. From
// the least significant column on, each column is written "<digit>c<carry>" (its result digit,
// 'c', and the carry it passes on), columns separated by ',', then ':' and the sum:
//   "57+68=" -> "5c1,2c1:125"   (7+8 = 15: digit 5 carry 1; 5+6+1 = 12: digit 2 carry 1)
// A missing digit of the shorter operand counts as 0. Only the sum after ':' is graded; the
// worked columns must be well-formed but need not be right.
#pragma once

#include "src/rl/addition_task.h"
#include "src/rl/task.h"

namespace rlf {

// The worked answer for a + b in the format above.
std::string worked_sum(std::string_view a, std::string_view b);

class LongAdditionTask : public Task {
 public:
  // Keys: min_digits (default 1), max_digits (default 4), format_reward (default 0).
  explicit LongAdditionTask(const TaskConfig& config);

  std::string name() const override { return "long-add"; }
  TaskSample sample(int64_t id) const override;
  double reward(const TaskSample& sample, std::string_view response) const override;
  int max_prompt_chars() const override { return 2 * digits_.max_digits + 2; }
  // Per column "dcC," (4 chars, the last without ','), then ':' and a sum of up to one digit
  // more than the longest operand: 5 * max_digits + 1.
  int max_response_chars() const override { return 5 * digits_.max_digits + 1; }

 private:
  uint64_t seed_;
  OperandDigits digits_;
  double format_reward_;
};

}  // namespace rlf
