// Labelled samples for training a learned reward model (verifier) on a task: half are the
// reference answer of a task sample (label 1), half a corrupted answer (one character changed,
// two different characters swapped, or the answer truncated), labelled by the task's own check,
// so a corruption that happens to be correct is labelled correct. Every choice is a Philox draw
// keyed by (seed, sample id): the same samples on any rank, in any order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/rl/task.h"

namespace rlf {

struct LabelledSample {
  std::vector<int> tokens;  // <bos> prompt answer <eos>
  float label = 0;          // 1: the answer is correct
};

// Training sample `index` (ids [0, kHeldOutBase)) or held-out sample `index`.
LabelledSample labelled_sample(const Task& task, int64_t index, bool heldout, uint64_t seed);

// `answer` with one deterministic corruption chosen by (seed, id); never equal to `answer`.
std::string corrupt_answer(const std::string& answer, uint64_t seed, int64_t id);

}  // namespace rlf
