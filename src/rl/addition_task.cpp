#include "src/rl/addition_task.h"

#include <algorithm>

#include "src/rl/sample_draws.h"

namespace rlf {

OperandDigits OperandDigits::read(const TaskParams& params, int default_max_digits) {
  OperandDigits d;
  d.min_digits = params.integer("min_digits", 1, 1, kMaxOperandDigits);
  d.max_digits = params.integer("max_digits", std::max(default_max_digits, d.min_digits), 1,
                                kMaxOperandDigits);
  if (d.max_digits < d.min_digits) {
    params.fail("max_digits = " + std::to_string(d.max_digits) +
                " is invalid (expected an integer >= min_digits = " + std::to_string(d.min_digits) +
                ")");
  }
  return d;
}

Operands draw_operands(const OperandDigits& digits, uint64_t seed, int64_t id) {
  // Positions: 0 and 1 the digit counts, then a's digits, then b's digits.
  const int a_len = uniform_int(seed, id, 0, digits.min_digits, digits.max_digits);
  const int b_len = uniform_int(seed, id, 1, digits.min_digits, digits.max_digits);
  uint64_t position = 2;
  auto number = [&](int length) {
    std::string text;
    for (int i = 0; i < length; ++i) {
      // The leading digit of a multi-digit number is 1-9 so no number has a leading zero.
      text.push_back(random_digit(seed, id, position++, i == 0 && length > 1 ? 1 : 0));
    }
    return text;
  };
  Operands operands;
  operands.a = number(a_len);
  operands.b = number(b_len);
  return operands;
}

std::string decimal_sum(std::string_view a, std::string_view b) {
  std::string reversed;
  int carry = 0;
  for (size_t i = 0; i < std::max(a.size(), b.size()) || carry; ++i) {
    const int da = i < a.size() ? a[a.size() - 1 - i] - '0' : 0;
    const int db = i < b.size() ? b[b.size() - 1 - i] - '0' : 0;
    const int column = da + db + carry;
    reversed.push_back(char('0' + column % 10));
    carry = column / 10;
  }
  return std::string(reversed.rbegin(), reversed.rend());
}

bool is_canonical_number(std::string_view text) {
  if (text.empty() || (text.size() > 1 && text[0] == '0')) return false;
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

AdditionTask::AdditionTask(const TaskConfig& config)
    : seed_(config.seed), digits_(), format_reward_(0) {
  const TaskParams params(config, {"min_digits", "max_digits"});
  digits_ = OperandDigits::read(params, 3);
  format_reward_ = params.format_reward();
}

TaskSample AdditionTask::sample(int64_t id) const {
  const Operands operands = draw_operands(digits_, seed_, id);
  return {id, operands.a + "+" + operands.b + "=", decimal_sum(operands.a, operands.b)};
}

double AdditionTask::reward(const TaskSample& sample, std::string_view response) const {
  // The length check first keeps the cost of a runaway response constant.
  if (response.size() > size_t(max_response_chars()) || !is_canonical_number(response)) return 0;
  return response == sample.answer ? 1.0 : format_reward_;
}

}  // namespace rlf
