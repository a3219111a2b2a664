#include "src/rl/verifier_samples.h"

#include <utility>

#include "src/rl/sample_draws.h"
#include "src/rl/tokenizer.h"

namespace rlf {

namespace {

// Draw positions of a sample's labelling stream (the task's own draws use another seed).
enum Draw : uint64_t { kPositive, kKind, kFirst, kSecond, kDigit };

uint64_t labelling_seed(uint64_t seed) {
  return seed ^ 0x5eed'0fe1'1ab3'11edULL;
}

std::string change_one(std::string answer, uint64_t seed, int64_t id) {
  if (answer.empty()) return "0";
  const int at = uniform_int(seed, id, kFirst, 0, int(answer.size()) - 1);
  const bool digit = answer[size_t(at)] >= '0' && answer[size_t(at)] <= '9';
  // A different digit: shift by 1..9 modulo 10 (any other character becomes a digit).
  answer[size_t(at)] =
      digit ? char('0' + (answer[size_t(at)] - '0' + uniform_int(seed, id, kDigit, 1, 9)) % 10)
            : random_digit(seed, id, kDigit);
  return answer;
}

}  // namespace

std::string corrupt_answer(const std::string& answer, uint64_t seed, int64_t id) {
  const int n = int(answer.size());
  switch (uniform_int(seed, id, kKind, 0, 2)) {
    case 0:
      return change_one(answer, seed, id);
    case 1: {
      // Swap two positions holding different characters (none: change one instead).
      const int first = n > 0 ? uniform_int(seed, id, kFirst, 0, n - 1) : 0;
      for (int step = 1; step < n; ++step) {
        const int other = (first + step) % n;
        if (answer[size_t(other)] != answer[size_t(first)]) {
          std::string swapped = answer;
          std::swap(swapped[size_t(first)], swapped[size_t(other)]);
          return swapped;
        }
      }
      return change_one(answer, seed, id);
    }
    default:
      // Drop the last 1..n-1 characters (a one-character answer is changed instead).
      if (n < 2) return change_one(answer, seed, id);
      return answer.substr(0, size_t(n - uniform_int(seed, id, kSecond, 1, n - 1)));
  }
}

LabelledSample labelled_sample(const Task& task, int64_t index, bool heldout, uint64_t seed) {
  const TaskSample sample = heldout ? task.heldout_sample(index) : task.train_sample(index);
  const uint64_t s = labelling_seed(seed);
  const bool positive = uniform_int(s, sample.id, kPositive, 0, 1) == 1;
  const std::string answer = positive ? sample.answer : corrupt_answer(sample.answer, s, sample.id);
  LabelledSample out;
  out.tokens.push_back(Tokenizer::kBos);
  for (const std::string* text : {&sample.prompt, &answer}) {
    const std::vector<int> t = Tokenizer::encode(*text);
    out.tokens.insert(out.tokens.end(), t.begin(), t.end());
  }
  out.tokens.push_back(Tokenizer::kEos);
  out.label = task.correct(sample, answer) ? 1.0f : 0.0f;
  return out;
}

}  // namespace rlf
