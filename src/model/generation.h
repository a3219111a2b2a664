// Batched autoregressive generation with a KV cache: prompts are prefilled together, then every
// decode step runs only the unfinished sequences (finished ones leave the batch). Tokens are
// drawn by the counter-based sampler keyed by (seed, sample id, position), so a sample's tokens
// do not depend on which other samples share its batch.
#pragma once

#include <cstdint>
#include <vector>

#include "src/model/transformer.h"

namespace rlf {

struct GenerationSettings {
  int max_new_tokens = 32;
  int eos_token = -1;  // < 0: no end-of-sequence token, generate max_new_tokens
  float temperature = 1.0f;
  float top_p = 1.0f;
  uint64_t seed = 0;
  bool use_kv_cache = true;  // false: recompute the whole prefix every step (benchmark baseline)
};

struct GeneratedSample {
  std::vector<int> tokens;      // response tokens (including the end token if one was drawn)
  std::vector<float> logprobs;  // behaviour log-prob of each response token
  bool ended = false;           // stopped at eos_token rather than at max_new_tokens
};

// With expert parallelism (Transformer::set_expert_parallel) the call is collective over the EP
// group: every rank steps until the last sequence of the group has finished.
std::vector<GeneratedSample> generate(Transformer<float>& model,
                                      const std::vector<std::vector<int>>& prompts,
                                      const std::vector<int64_t>& sample_ids,
                                      const GenerationSettings& settings);

}  // namespace rlf
