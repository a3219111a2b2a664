// Helpers of the activation-peak tests (tests/rl/test_activation_peak.cpp on one rank,
// tests/mpi/test_tensor_parallel_activation_peak.cpp at TP): an arena's measured peak over some
// work, prompts and rollouts of given lengths, and the 5% comparison.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "src/rl/rollout.h"

namespace rlf::test {

// Bytes `work` held above the arena's use at its start, at its highest.
template <typename Work>
size_t measured_peak(Arena& device, Work work) {
  const size_t before = device.used();
  device.start_phase_peak();
  work();
  return device.phase_peak() - before;
}

// Prompts of lengths spread over [shortest, longest] (token 0 excluded: it is no eos here).
inline std::vector<std::vector<int>> prompts_of(int count, int shortest, int longest, int vocab) {
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < count; ++i) {
    const int length = shortest + (count > 1 ? (longest - shortest) * i / (count - 1) : 0);
    std::vector<int> p;
    for (int t = 0; t < length; ++t) p.push_back(1 + (7 * i + 3 * t) % (vocab - 1));
    prompts.push_back(p);
  }
  return prompts;
}

inline std::vector<int> lengths_of(const std::vector<std::vector<int>>& sequences, int minus = 0) {
  std::vector<int> lengths;
  for (const auto& s : sequences) lengths.push_back(int(s.size()) - minus);
  return lengths;
}

inline void expect_within_5_percent(size_t measured, size_t analytic, const std::string& what) {
  const double error = std::abs(double(measured) - double(analytic)) / double(analytic);
  EXPECT_LE(error, 0.05) << what << ": measured " << measured << " B, analytic " << analytic
                         << " B";
}

// A batch: `samples` prompts of lengths spread over [shortest_prompt, longest_prompt] of `model`,
// each followed by `new_tokens` generated tokens.
struct PeakCase {
  std::string model;
  int samples, shortest_prompt, longest_prompt, new_tokens;
};

// Rollouts of `c`'s prompts with responses of c.new_tokens tokens, and their sequences.
inline std::vector<Rollout> rollouts_of(const PeakCase& c, int vocab,
                                        std::vector<std::vector<int>>& sequences) {
  std::vector<Rollout> rollouts;
  for (const auto& prompt : prompts_of(c.samples, c.shortest_prompt, c.longest_prompt, vocab)) {
    Rollout r;
    r.prompt = prompt;
    for (int t = 0; t < c.new_tokens; ++t) r.response.push_back(1 + t % (vocab - 1));
    r.behaviour_logp.assign(r.response.size(), -1.0f);
    r.advantage = 0.5;
    std::vector<int> sequence = r.prompt;
    sequence.insert(sequence.end(), r.response.begin(), r.response.end());
    sequences.push_back(sequence);
    rollouts.push_back(r);
  }
  return rollouts;
}

}  // namespace rlf::test
