// Held-out accuracy: greedy generation (temperature 0) on the task's held-out prompts.
#pragma once

#include <cstdint>

#include "src/model/transformer.h"
#include "src/rl/task.h"

namespace rlf {

struct Evaluation {
  int prompts = 0;
  int correct = 0;
  double mean_reward = 0;
  int64_t generated_tokens = 0;
  double seconds = 0;
  double accuracy() const { return prompts ? double(correct) / prompts : 0.0; }
};

// Held-out prompts [0, prompts) in batches of `batch` sequences.
Evaluation evaluate(Transformer<float>& model, const Task& task, int prompts, int batch);

}  // namespace rlf
