#include "src/rl/rl_step.h"

#include <algorithm>
#include <span>
#include <stdexcept>
#include <string>

#include "src/rl/policy_loss.h"

namespace rlf {

void StepStats::add(const StepStats& o) {
  samples += o.samples;
  reward += o.reward;
  correct += o.correct;
  response_tokens += o.response_tokens;
  tokens += o.tokens;
  kl += o.kl;
  clipped_tokens += o.clipped_tokens;
}

namespace {

size_t ceil_div(size_t a, size_t b) {
  return (a + b - 1) / b;
}

void attach_logprobs(Transformer<float>& model, std::span<Rollout> rollouts, int micro_batch,
                     float temperature, std::vector<float> Rollout::*into,
                     const DataParallelHooks& parallel) {
  const size_t micros = parallel.micro_batches(ceil_div(rollouts.size(), size_t(micro_batch)));
  for (size_t m = 0; m < micros; ++m) {
    const size_t begin = std::min(rollouts.size(), m * size_t(micro_batch));
    const size_t end = std::min(rollouts.size(), begin + size_t(micro_batch));
    std::vector<const Rollout*> micro;
    for (size_t i = begin; i < end; ++i) micro.push_back(&rollouts[i]);
    const auto logp = response_logprobs(model, micro, temperature);
    for (size_t i = begin; i < end; ++i) rollouts[i].*into = logp[i - begin];
  }
}

}  // namespace

void attach_reference_logprobs(Transformer<float>& reference, std::vector<Rollout>& rollouts,
                               int micro_batch, float temperature,
                               const DataParallelHooks& parallel) {
  attach_logprobs(reference, rollouts, micro_batch, temperature, &Rollout::reference_logp,
                  parallel);
}

size_t minibatch_begin(size_t rollouts, int group_size, int minibatches, int mb) {
  if (mb >= minibatches) return rollouts;
  const size_t groups = rollouts / size_t(group_size);
  return groups * size_t(mb) / size_t(minibatches) * size_t(group_size);
}

std::vector<size_t> minibatch_indices(size_t rollouts, const RlStepSettings& settings, int mb) {
  std::vector<size_t> sizes = settings.block_sizes;
  if (sizes.empty()) {
    const size_t blocks = size_t(std::max(1, settings.sample_blocks));
    if (rollouts % blocks != 0) {
      throw std::logic_error("minibatch_indices: " + std::to_string(rollouts) +
                             " rollouts are not " + std::to_string(blocks) + " equal blocks");
    }
    sizes.assign(blocks, rollouts / blocks);
  }
  std::vector<size_t> indices;
  size_t block_begin = 0;
  for (const size_t block : sizes) {
    const size_t first = minibatch_begin(block, settings.group_size, settings.minibatches, mb);
    const size_t last = minibatch_begin(block, settings.group_size, settings.minibatches, mb + 1);
    for (size_t i = first; i < last; ++i) indices.push_back(block_begin + i);
    block_begin += block;
  }
  if (block_begin != rollouts) {
    throw std::logic_error("minibatch_indices: blocks of " + std::to_string(block_begin) +
                           " rollouts for " + std::to_string(rollouts));
  }
  return indices;
}

void attach_proximal_logprobs(Transformer<float>& policy, std::vector<Rollout>& rollouts,
                              const RlStepSettings& settings, const DataParallelHooks& parallel) {
  const size_t first =
      minibatch_begin(rollouts.size(), settings.group_size, settings.minibatches, 1);
  attach_logprobs(policy, std::span<Rollout>(rollouts).subspan(first), settings.micro_batch,
                  settings.temperature, &Rollout::proximal_logp, parallel);
}

StepStats optimize_on_rollouts(Transformer<float>& policy, AdamW<float>& optimizer,
                               const std::vector<Rollout>& rollouts, const RlStepSettings& settings,
                               const DataParallelHooks& parallel,
                               const MinibatchGradient& gradient) {
  StepStats stats;
  for (const Rollout& r : rollouts) {
    stats.samples += 1;
    stats.reward += r.reward;
    stats.correct += r.reward >= 1.0;
    stats.response_tokens += double(r.response.size());
    stats.tokens += double(r.prompt.size() + r.response.size());
  }
  for (int mb = 0; mb < settings.minibatches; ++mb) {
    std::vector<const Rollout*> minibatch;
    for (const size_t i : minibatch_indices(rollouts.size(), settings, mb))
      minibatch.push_back(&rollouts[i]);
    double local_tokens = 0;
    for (const Rollout* r : minibatch) local_tokens += double(r->response.size());
    // The normalizer counts the response tokens of the minibatch on every learner, so that the
    // summed gradient equals the gradient of the whole minibatch on one rank.
    const double normalizer = parallel.sum(local_tokens);
    const double all_samples = parallel.sum(double(minibatch.size()));
    policy.zero_gradients();
    if (gradient) {
      const PpoStats s = gradient(minibatch, normalizer, all_samples);
      stats.kl += s.kl_sum;
      stats.clipped_tokens += s.clipped_tokens;
    }
    const size_t count = minibatch.size(), piece = size_t(settings.micro_batch);
    const size_t micros = gradient ? 0 : parallel.micro_batches(ceil_div(count, piece));
    for (size_t m = 0; m < micros; ++m) {
      const size_t begin = std::min(count, m * piece);
      const size_t end = std::min(count, begin + piece);
      const std::vector<const Rollout*> micro(minibatch.begin() + std::ptrdiff_t(begin),
                                              minibatch.begin() + std::ptrdiff_t(end));
      const float aux = policy.config().aux_loss_coef * float(double(end - begin) / all_samples);
      const PpoStats s = accumulate_policy_gradient(policy, micro, normalizer, settings.temperature,
                                                    settings.ppo, aux);
      stats.kl += s.kl_sum;
      stats.clipped_tokens += s.clipped_tokens;
    }
    parallel.reduce_gradients();
    optimizer.step();
  }
  parallel.reduce_stats(stats);
  return stats;
}

}  // namespace rlf
