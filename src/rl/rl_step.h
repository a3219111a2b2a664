// The training half of one RL step on rollouts that are already scored: optional reference
// log-probs, then one optimizer step per minibatch of prompt groups, micro-batches accumulating
// gradients. Data parallelism plugs in through two hooks, so one rank and N learner ranks run the
// same code: the loss normalizer and the gradients are summed over the learners before AdamW.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "src/model/optimizer.h"
#include "src/rl/ppo.h"
#include "src/rl/rollout.h"

namespace rlf {

struct RlStepSettings {
  int group_size = 8;
  int minibatches = 1;
  // The step's rollouts are this many equal blocks of whole prompt groups, one per rank that
  // generated them (a pipeline's stages), and each minibatch takes its share of every block, as
  // those ranks would in a data-parallel run (1: the rollouts are one rank's).
  int sample_blocks = 1;
  // Blocks of unequal sizes instead (StaleSync with pipelines: each rank of the replica finished
  // its own count of groups; empty: sample_blocks equal ones). Each minibatch takes its share of
  // every block all the same.
  std::vector<size_t> block_sizes;
  // The caller attached the proximal log-probs of the rollouts after each block's first minibatch
  // itself (pipelines: by a forward-only pass over the stages), so training does not.
  bool proximal_attached = false;
  int micro_batch = 64;
  float temperature = 1.0f;
  // ppo.decoupled: StaleSync's objective, anchored at the policy of the step's start (ppo.h).
  // The first minibatch's forward runs at exactly those weights, so its own log-probs are the
  // anchor; only later minibatches need a separate forward (attach_proximal_logprobs).
  PpoSettings ppo;
};

// Sums over a step's samples (of this rank, or of all learners after reduce()).
struct StepStats {
  double samples = 0, reward = 0, correct = 0, response_tokens = 0, tokens = 0;
  double kl = 0, clipped_tokens = 0;

  void add(const StepStats& other);
  double mean_reward() const { return samples ? reward / samples : 0; }
  double accuracy() const { return samples ? correct / samples : 0; }
  double mean_response() const { return samples ? response_tokens / samples : 0; }
  double kl_per_token() const { return response_tokens ? kl / response_tokens : 0; }
  double clip_fraction() const { return response_tokens ? clipped_tokens / response_tokens : 0; }
};

// How learners cooperate; the defaults are a single rank.
struct DataParallelHooks {
  std::function<double(double)> sum = [](double x) { return x; };    // sum over learners
  std::function<void()> reduce_gradients = [] {};                    // sum of gradients
  std::function<void(StepStats&)> reduce_stats = [](StepStats&) {};  // sums over learners
  // How many micro-batches this rank runs, given how many its own rollouts fill: with expert
  // parallelism forward and backward are collective over the EP group, so ranks that train
  // different numbers of rollouts (StaleSync) all run the largest count, the extra ones empty.
  std::function<size_t(size_t)> micro_batches = [](size_t own) { return own; };
};

// Reference-policy log-probs of every rollout's response, in micro-batches.
void attach_reference_logprobs(Transformer<float>& reference, std::vector<Rollout>& rollouts,
                               int micro_batch, float temperature,
                               const DataParallelHooks& parallel = {});
// The first rollout of minibatch `mb`: minibatches split the prompt groups evenly, and the last
// takes everything left (a learner's share may end in a partial group).
size_t minibatch_begin(size_t rollouts, int group_size, int minibatches, int mb);
// The indices of minibatch `mb`'s rollouts: its share of each of settings.sample_blocks equal
// blocks, or of the blocks of settings.block_sizes (minibatch_begin within the block), block by
// block.
std::vector<size_t> minibatch_indices(size_t rollouts, const RlStepSettings& settings, int mb);
// The decoupled objective's anchor for the rollouts after the first minibatch (whose optimizer
// steps change the weights before they train): the current policy's log-probs, micro-batched.
void attach_proximal_logprobs(Transformer<float>& policy, std::vector<Rollout>& rollouts,
                              const RlStepSettings& settings,
                              const DataParallelHooks& parallel = {});

// Adds the gradient of one minibatch's loss into the policy's gradients: the minibatch's
// rollouts, the loss normalizer (its response tokens on every learner) and its sample count on
// every learner (each micro-batch's router loss is weighted by its share of them). Returns the
// PPO statistics of the minibatch's tokens.
using MinibatchGradient = std::function<PpoStats(const std::vector<const Rollout*>& minibatch,
                                                 double normalizer, double all_samples)>;

// Trains on `rollouts` (whole prompt groups, consecutive) and returns the step's statistics.
// `gradient` computes each minibatch's gradient (empty: forward and backward of `policy` in
// micro-batches of settings.micro_batch; a pipeline-parallel stage runs its schedule instead).
StepStats optimize_on_rollouts(Transformer<float>& policy, AdamW<float>& optimizer,
                               const std::vector<Rollout>& rollouts, const RlStepSettings& settings,
                               const DataParallelHooks& parallel = {},
                               const MinibatchGradient& gradient = {});

}  // namespace rlf
