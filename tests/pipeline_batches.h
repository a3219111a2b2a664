// Shared by the pipeline tests: a step's micro-batches on fresh random inputs, the single-rank
// model's step on them (forward and backward of each micro-batch in turn, gradients accumulated),
// and the comparison of a pipeline stage's gradients with that model's, tensor by tensor.
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "src/model/pipeline_stage.h"
#include "src/model/sequence_loss.h"
#include "src/model/transformer.h"
#include "tests/test_util.h"

namespace rlf::test {

// m micro-batches of 1-3 sequences of 1-`longest` tokens; the loss weights are 1 / (tokens of
// the whole step), so the step's loss is the mean cross-entropy over all its tokens.
template <typename T>
std::vector<PipelineMicroBatch<T>> random_micro_batches(int m, int vocab, int longest,
                                                        uint64_t seed) {
  std::mt19937_64 gen(seed);
  auto draw = [&](int lo, int hi) { return lo + int(gen() % uint64_t(hi - lo + 1)); };
  std::vector<PipelineMicroBatch<T>> batches(static_cast<size_t>(m));
  int total = 0;
  for (PipelineMicroBatch<T>& b : batches) {
    for (int s = draw(1, 3); s > 0; --s) {
      for (int t = draw(1, longest); t > 0; --t) {
        b.tokens.push_back(draw(0, vocab - 1));
        b.targets.push_back(draw(0, vocab - 1));
      }
      b.seq_offsets.push_back(int(b.tokens.size()));
    }
    total += b.token_count();
  }
  for (PipelineMicroBatch<T>& b : batches) b.weights.assign(b.tokens.size(), T(1) / T(total));
  return batches;
}

// The single-rank step: returns its loss (weighted NLL + aux_weight * aux over every
// micro-batch); gradients accumulate into model.gradients() (zeroed first).
template <typename T>
double reference_step(Transformer<T>& model, const std::vector<PipelineMicroBatch<T>>& batches,
                      T aux_weight) {
  model.zero_gradients();
  const int V = model.config().vocab_size;
  double loss = 0;
  for (const PipelineMicroBatch<T>& b : batches) {
    const int N = b.token_count();
    const T* logits = model.forward(b.tokens.data(), b.seq_offsets.data(), b.sequences());
    std::vector<T> dlogits(size_t(N) * V, T(0));
    loss += double(weighted_nll(model.ops(), model.device(), logits, b.targets.data(),
                                b.weights.data(), N, V, dlogits.data()));
    loss += double(aux_weight) * double(model.aux_loss());
    model.backward(dlogits.data(), aux_weight);
  }
  return loss;
}

// Every tensor `stage` stores: its gradient equals the reference's tensor of the same name.
template <typename T>
void expect_stage_gradients(const Transformer<T>& stage, const Transformer<T>& reference,
                            double atol, double rtol) {
  for (const ParameterTensor& t : stage.layout().tensors()) {
    const ParameterTensor* want = reference.layout().find(t.name);
    ASSERT_NE(want, nullptr) << t.name;
    ASSERT_EQ(want->numel, t.numel) << t.name;
    expect_close(stage.gradients() + t.offset, reference.gradients() + want->offset,
                 size_t(t.numel), "gradient of " + t.name, atol, rtol);
  }
}

}  // namespace rlf::test
