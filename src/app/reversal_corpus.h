// A seeded synthetic corpus for supervised language-model training before the RL tasks exist:
// "<bos> d1 d2 ... dL <sep> dL ... d2 d1 <eos>" (reverse a digit string). Sample i is a pure
// function of (seed, i); training and held-out samples come from disjoint id ranges.
#pragma once

#include <cstdint>
#include <vector>

namespace rlf {

struct ReversalCorpus {
  static constexpr int kBos = 1, kEos = 2, kSep = 3, kFirstDigit = 4;
  static constexpr int kVocabularyNeeded = kFirstDigit + 10;
  static constexpr int64_t kHeldOutBase = int64_t(1) << 40;

  uint64_t seed = 1;
  int min_digits = 3;
  int max_digits = 8;

  std::vector<int> digits(int64_t sample_id) const;
  std::vector<int> prompt(int64_t sample_id) const;  // <bos> digits <sep>
  std::vector<int> answer(int64_t sample_id) const;  // reversed digits <eos>
};

}  // namespace rlf
