// The generation check of the model-parallel MPI tests: a rank's part of the model generates the
// single-rank model's sequences.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "src/model/generation.h"
#include "src/model/transformer.h"
#include "tests/test_util.h"

namespace rlf::test {

// Whole sequences through generate(), sampled (temperature 1) and greedy, `max_new_tokens` each:
// `model` (collective over its groups) gives `reference`'s tokens and log-probs (1e-5).
inline void expect_generation_like(Transformer<float>& model, Transformer<float>& reference,
                                   const std::vector<std::vector<int>>& prompts,
                                   const std::vector<int64_t>& ids, uint64_t seed,
                                   int max_new_tokens) {
  for (float temperature : {1.0f, 0.0f}) {
    GenerationSettings settings;
    settings.max_new_tokens = max_new_tokens;
    settings.temperature = temperature;
    settings.seed = seed;
    const auto want = generate(reference, prompts, ids, settings);
    const auto got = generate(model, prompts, ids, settings);
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < want.size(); ++s) {
      EXPECT_EQ(got[s].tokens, want[s].tokens)
          << "sequence " << s << " temperature " << temperature;
      expect_close(got[s].logprobs, want[s].logprobs, "log-probs", 1e-5, 1e-5);
    }
  }
}

}  // namespace rlf::test
