// Training and measuring a learned reward model (verifier) on a task's labelled samples
// (src/rl/verifier_samples.h): one optimizer step of binary cross-entropy (plus the router's
// load-balancing loss), and held-out accuracy (score > 0.5 agrees with the label).
#pragma once

#include <cstdint>

#include "src/model/reward_model_optimizer.h"
#include "src/rl/task.h"

namespace rlf {

struct VerifierStep {
  float loss = 0;        // mean binary cross-entropy (nats per sample)
  double grad_norm = 0;  // before clipping
  int64_t tokens = 0;
};

// One step on training samples [first, first + batch).
VerifierStep verifier_step(RewardModel<float>& model, RewardModelOptimizer& optimizer,
                           const Task& task, uint64_t seed, int64_t first, int batch);

struct VerifierAccuracy {
  int samples = 0;
  int correct = 0;    // the score's side of 0.5 matches the label
  int positives = 0;  // samples labelled correct (chance accuracy: the larger class's share)
  double accuracy() const { return samples ? double(correct) / samples : 0.0; }
};

// Held-out samples [0, samples), `batch` per forward.
VerifierAccuracy verifier_accuracy(RewardModel<float>& model, const Task& task, uint64_t seed,
                                   int samples, int batch);

}  // namespace rlf
