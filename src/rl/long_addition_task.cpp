#include "src/rl/long_addition_task.h"

#include <algorithm>

namespace rlf {

namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// True when `columns` is "<digit>c<0|1>" repeated one or more times, separated by ','.
bool are_worked_columns(std::string_view columns) {
  constexpr size_t kColumnChars = 3;
  if ((columns.size() + 1) % (kColumnChars + 1) != 0) return false;
  for (size_t start = 0; start < columns.size(); start += kColumnChars + 1) {
    const std::string_view column = columns.substr(start, kColumnChars);
    if (!is_digit(column[0]) || column[1] != 'c' || (column[2] != '0' && column[2] != '1')) {
      return false;
    }
    if (start + kColumnChars < columns.size() && columns[start + kColumnChars] != ',') return false;
  }
  return true;
}

}  // namespace

std::string worked_sum(std::string_view a, std::string_view b) {
  std::string worked;
  int carry = 0;
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const int da = i < a.size() ? a[a.size() - 1 - i] - '0' : 0;
    const int db = i < b.size() ? b[b.size() - 1 - i] - '0' : 0;
    const int column = da + db + carry;
    carry = column / 10;
    if (i > 0) worked.push_back(',');
    worked += {char('0' + column % 10), 'c', char('0' + carry)};
  }
  return worked + ":" + decimal_sum(a, b);
}

LongAdditionTask::LongAdditionTask(const TaskConfig& config)
    : seed_(config.seed), digits_(), format_reward_(0) {
  const TaskParams params(config, {"min_digits", "max_digits"});
  digits_ = OperandDigits::read(params, 4);
  format_reward_ = params.format_reward();
}

TaskSample LongAdditionTask::sample(int64_t id) const {
  const Operands operands = draw_operands(digits_, seed_, id);
  return {id, operands.a + "+" + operands.b + "=", worked_sum(operands.a, operands.b)};
}

double LongAdditionTask::reward(const TaskSample& sample, std::string_view response) const {
  // The length check first keeps the cost of a runaway response constant.
  if (response.size() > size_t(max_response_chars())) return 0;
  const size_t colon = response.find(':');
  if (colon == std::string_view::npos) return 0;
  const std::string_view sum = response.substr(colon + 1);
  if (!are_worked_columns(response.substr(0, colon)) || !is_canonical_number(sum)) return 0;
  const std::string_view answer = sample.answer;
  const size_t answer_colon = answer.rfind(':');
  const std::string_view reference =
      answer_colon == std::string_view::npos ? answer : answer.substr(answer_colon + 1);
  return sum == reference ? 1.0 : format_reward_;
}

}  // namespace rlf
