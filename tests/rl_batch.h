// One global RL batch for the tests that compare sharded training (data- or expert-parallel)
// with one rank: 6 prompts x 4 samples drawn from the policy, with fixed non-zero advantages.
#pragma once

#include <vector>

#include "src/rl/rollout.h"
#include "src/rl/task.h"
#include "src/rl/tokenizer.h"

namespace rlf::test {

inline constexpr int kBatchPrompts = 6;
inline constexpr int kBatchGroupSize = 4;

// Every rank calls it with identical weights and gets the identical batch.
inline std::vector<Rollout> global_rl_batch(Transformer<float>& policy, const Task& task,
                                            int step) {
  GenerationSettings sampling;
  sampling.eos_token = Tokenizer::kEos;
  sampling.max_new_tokens = task.max_response_chars() + 1;
  sampling.seed = 3;
  std::vector<Rollout> batch =
      generate_rollouts(policy, task, int64_t(step) * kBatchPrompts, kBatchPrompts, kBatchGroupSize,
                        sampling, step, AdvantageEstimator::Grpo);
  // An untrained policy scores 0 everywhere, so GRPO's advantages would all be 0 and the
  // gradients too: fixed non-zero advantages make every sample pull.
  for (size_t i = 0; i < batch.size(); ++i) batch[i].advantage = double(int(i * 7 % 11) - 5) / 5;
  return batch;
}

}  // namespace rlf::test
