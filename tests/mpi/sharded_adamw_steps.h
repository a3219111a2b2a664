// The AdamW check of the model-parallel MPI tests: a rank's part of the model, stepped with its
// optimizer shard, takes the single-rank model's clipped steps.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "src/model/optimizer.h"
#include "src/model/transformer.h"
#include "tests/test_util.h"

namespace rlf::test {

// Three AdamW steps of `part` (this rank's part of the model, with `shard`) and of the
// single-rank `reference`, both initialized alike, each step clipping (max norm 0.5, far below the
// gradients' norm): the same random whole-model gradient on every rank, each rank taking its part
// (`own_part` of a whole-model buffer). Expects the single-rank norm (1e-6 relative) at every step
// and the single-rank parameters after (normalized squared error below 1e-10).
inline void expect_single_rank_clipped_steps(
    Transformer<float>& part, OptimizerShard shard, Transformer<float>& reference,
    const std::function<std::vector<float>(const float* whole)>& own_part, uint64_t seed) {
  AdamWHyper hyper;
  hyper.learning_rate = 0.01f;
  const float max_norm = 0.5f;
  AdamW<float> part_adamw(part, hyper, max_norm), reference_adamw(reference, hyper, max_norm);
  part_adamw.set_shard(std::move(shard));
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int step = 0; step < 3; ++step) {
    for (const ParameterTensor& t : reference.layout().tensors())
      for (int64_t i = 0; i < t.numel; ++i) reference.gradients()[t.offset + i] = normal(gen);
    const std::vector<float> gradient = own_part(reference.gradients());
    std::memcpy(part.gradients(), gradient.data(), gradient.size() * sizeof(float));
    const double norm = part_adamw.step(), want = reference_adamw.step();
    EXPECT_NEAR(norm, want, 1e-6 * want) << "step " << step;
  }
  const std::vector<float> want = own_part(reference.parameters());
  EXPECT_LT(nmse(part.parameters(), want.data(), want.size()), 1e-10);
}

}  // namespace rlf::test
