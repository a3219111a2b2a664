#include "src/app/reversal_corpus.h"

#include "kernels/rng.h"

namespace rlf {

std::vector<int> ReversalCorpus::digits(int64_t sample_id) const {
  const int span = max_digits - min_digits + 1;
  const auto words = random_words(seed, uint64_t(sample_id), 0);
  const int length = min_digits + int(words[0] % uint32_t(span));
  std::vector<int> out;
  for (int i = 0; i < length; ++i) {
    out.push_back(int(random_words(seed, uint64_t(sample_id), uint64_t(i) + 1)[0] % 10u));
  }
  return out;
}

std::vector<int> ReversalCorpus::prompt(int64_t sample_id) const {
  std::vector<int> out{kBos};
  for (int d : digits(sample_id)) out.push_back(kFirstDigit + d);
  out.push_back(kSep);
  return out;
}

std::vector<int> ReversalCorpus::answer(int64_t sample_id) const {
  const std::vector<int> d = digits(sample_id);
  std::vector<int> out;
  for (auto it = d.rbegin(); it != d.rend(); ++it) out.push_back(kFirstDigit + *it);
  out.push_back(kEos);
  return out;
}

}  // namespace rlf
