// Supervised fine-tuning on task demonstrations: next-token cross-entropy on the reference
// answer (and its <eos>), the prompt tokens unweighted. The warm start RL begins from.
#pragma once

#include <cstdint>

#include "src/model/optimizer.h"
#include "src/model/transformer.h"
#include "src/rl/task.h"

namespace rlf {

struct SftStep {
  float loss = 0;        // mean cross-entropy per answer token (nats)
  double grad_norm = 0;  // before clipping
  int64_t tokens = 0;    // all positions trained on (prompt + answer)
};

// One optimizer step on demonstrations of training prompts [first_prompt, first_prompt + batch).
SftStep sft_step(Transformer<float>& model, AdamW<float>& optimizer, const Task& task,
                 int64_t first_prompt, int batch);

}  // namespace rlf
