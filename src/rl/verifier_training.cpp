#include "src/rl/verifier_training.h"

#include <vector>

#include "src/rl/verifier_samples.h"

namespace rlf {

VerifierStep verifier_step(RewardModel<float>& model, RewardModelOptimizer& optimizer,
                           const Task& task, uint64_t seed, int64_t first, int batch) {
  std::vector<int> tokens, offsets{0};
  std::vector<float> labels;
  for (int i = 0; i < batch; ++i) {
    const LabelledSample s = labelled_sample(task, first + i, /*heldout=*/false, seed);
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
    offsets.push_back(int(tokens.size()));
    labels.push_back(s.label);
  }
  model.zero_gradients();
  const std::vector<float> logits =
      model.logits(tokens.data(), offsets.data(), batch, /*training=*/true);
  std::vector<float> dlogits(static_cast<size_t>(batch));
  VerifierStep step;
  step.loss = binary_cross_entropy(logits.data(), labels.data(), batch, dlogits.data());
  model.backward(dlogits.data(), model.config().aux_loss_coef);
  step.grad_norm = optimizer.step();
  step.tokens = int64_t(tokens.size());
  return step;
}

VerifierAccuracy verifier_accuracy(RewardModel<float>& model, const Task& task, uint64_t seed,
                                   int samples, int batch) {
  std::vector<std::vector<int>> sequences;
  std::vector<float> labels;
  for (int i = 0; i < samples; ++i) {
    LabelledSample s = labelled_sample(task, i, /*heldout=*/true, seed);
    sequences.push_back(std::move(s.tokens));
    labels.push_back(s.label);
  }
  const std::vector<double> scores = model.scores(sequences, batch);
  VerifierAccuracy a;
  a.samples = samples;
  for (int i = 0; i < samples; ++i) {
    a.positives += labels[size_t(i)] > 0.5f;
    a.correct += (scores[size_t(i)] > 0.5) == (labels[size_t(i)] > 0.5f);
  }
  return a;
}

}  // namespace rlf
