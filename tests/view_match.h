// A model view (an expert table's, a stitched one) against the model it stands for: bit for bit
// the same training-forward logits and the same generated tokens and log-probs (prefill and
// decode). With TP or EP both run collectively over their groups.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "src/model/generation.h"
#include "src/model/transformer.h"

namespace rlf::test {

inline void expect_computes_what(Transformer<float>& model, Transformer<float>& view,
                                 const std::vector<int>& tokens, const std::vector<int>& offsets,
                                 const std::vector<std::vector<int>>& prompts,
                                 const std::vector<int64_t>& ids) {
  const int S = int(offsets.size()) - 1;
  const size_t logits = tokens.size() * size_t(model.config().vocab_size);
  const float* flat = model.forward(tokens.data(), offsets.data(), S);
  const std::vector<float> want(flat, flat + logits);
  model.release_activations();
  const float* got = view.forward(tokens.data(), offsets.data(), S);
  EXPECT_EQ(0, std::memcmp(got, want.data(), logits * sizeof(float)));
  view.release_activations();

  GenerationSettings sampling;
  sampling.max_new_tokens = 6;
  sampling.seed = 4;
  const auto a = generate(model, prompts, ids, sampling);
  const auto b = generate(view, prompts, ids, sampling);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    EXPECT_EQ(0, std::memcmp(a[i].logprobs.data(), b[i].logprobs.data(),
                             a[i].logprobs.size() * sizeof(float)));
  }
}

}  // namespace rlf::test
