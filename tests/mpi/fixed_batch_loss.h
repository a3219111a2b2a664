// The loss of a model on one fixed token sequence: what the expert-parallel training tests compare
// bit for bit between learners that hold the same weights in different layouts.
#pragma once

#include <cmath>
#include <vector>

#include "src/model/transformer.h"

namespace rlf::test {

// Mean negative log-likelihood of 12 fixed tokens (every rank the same ones; collective with
// expert parallelism).
inline double fixed_batch_loss(Transformer<float>& model) {
  const int T = 12, V = model.config().vocab_size;
  std::vector<int> tokens(static_cast<size_t>(T)), offsets{0, T};
  for (int t = 0; t < T; ++t) tokens[size_t(t)] = (t * 5 + 3) % V;
  const float* logits = model.forward(tokens.data(), offsets.data(), 1);
  double loss = 0;
  for (int t = 0; t + 1 < T; ++t) {
    const float* row = logits + int64_t(t) * V;
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(double(row[v]));
    loss += std::log(z) - double(row[tokens[size_t(t) + 1]]);
  }
  model.release_activations();
  return loss / (T - 1);
}

}  // namespace rlf::test
