#include "src/app/pipeline_reference.h"

#include <mpi.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>

#include "src/app/pipeline_parallel_train.h"
#include "src/model/pipeline_stage.h"
#include "src/rl/policy_loss.h"
#include "src/runtime/pipeline_step.h"

namespace rlf {

namespace {

// The last stage's log-probs of the micro-batches' samples onto every rank of the pipeline.
void broadcast_from_last_stage(const PipelineGroups& groups, std::vector<Rollout>& samples,
                               const SampleMicroBatches& micro_batches,
                               std::vector<float> Rollout::*into) {
  const HierarchicalComm& pipeline = groups.pipeline();
  const int last = pipeline.size() - 1;
  std::vector<float> all;
  size_t total = 0;
  for (const auto& micro : micro_batches) {
    for (const size_t i : micro) {
      const std::vector<float>& logp = samples[i].*into;
      all.insert(all.end(), logp.begin(), logp.end());
      total += samples[i].response.size();
    }
  }
  if (pipeline.rank() == last && all.size() != total) {
    throw std::logic_error("pipeline_logprobs: the last stage lacks log-probs");
  }
  all.resize(total);
  MPI_Bcast(all.data(), int(total), MPI_FLOAT, last, pipeline.comm);
  if (pipeline.rank() == last) {
    for (int r = 0; r < pipeline.size(); ++r) {
      if (r != last) {
        groups.links().count_send(pipeline.world_ranks[size_t(r)], uint64_t(total) * sizeof(float));
      }
    }
  }
  size_t at = 0;
  for (const auto& micro : micro_batches) {
    for (const size_t i : micro) {
      const size_t n = samples[i].response.size();
      (samples[i].*into)
          .assign(all.begin() + std::ptrdiff_t(at), all.begin() + std::ptrdiff_t(at + n));
      at += n;
    }
  }
}

// Each block of `blocks` (empty: `samples` in groups.model_parallel().size() equal blocks) from
// its sample first(block size) to its end, in pieces of `micro_batch`.
SampleMicroBatches block_micro_batches(const PipelineGroups& groups, size_t samples,
                                       std::vector<size_t> blocks, int micro_batch,
                                       const std::function<size_t(size_t)>& first,
                                       const char* caller) {
  const size_t ranks = size_t(groups.model_parallel().size());
  if (blocks.empty()) {
    if (samples % ranks != 0) {
      throw std::logic_error(std::string(caller) + ": " + std::to_string(samples) +
                             " samples are not " + std::to_string(ranks) + " equal blocks");
    }
    blocks.assign(ranks, samples / ranks);
  }
  SampleMicroBatches micro_batches;
  size_t begin = 0;
  for (const size_t block : blocks) {
    const size_t end = begin + block;
    for (size_t b = begin + first(block); b < end; b += size_t(micro_batch)) {
      micro_batches.emplace_back();
      for (size_t i = b; i < std::min(end, b + size_t(micro_batch)); ++i) {
        micro_batches.back().push_back(i);
      }
    }
    begin = end;
  }
  if (begin != samples) {
    throw std::logic_error(std::string(caller) + ": blocks of " + std::to_string(begin) +
                           " samples for " + std::to_string(samples));
  }
  return micro_batches;
}

}  // namespace

uint64_t pipeline_logprobs(Transformer<float>& stage_model, const PipelineGroups& groups,
                           std::vector<Rollout>& samples, const SampleMicroBatches& micro_batches,
                           std::vector<float> Rollout::*into, float temperature,
                           int longest_sequence, RoleExpertParallel* ep) {
  for (Rollout& r : samples) (r.*into).clear();
  // The schedule's micro-batch count: interleaved, a multiple of the stages; with EP, the same on
  // every pipeline of the stage's data-parallel group (whose MoE layers exchange in step). The
  // extra micro-batches are empty: nothing to compute, but their exchanges take part.
  long long count = (long long)micro_batches.size();
  const PipelineShape& layout = groups.shape();
  if (layout.interleaved()) count = (count + layout.stages - 1) / layout.stages * layout.stages;
  if (ep) {
    MPI_Allreduce(MPI_IN_PLACE, &count, 1, MPI_LONG_LONG, MPI_MAX, groups.data_parallel().comm);
  }
  if (count == 0) return 0;  // (every rank of the pipeline, and with EP of the group, agrees)
  size_t widest = 1;
  for (const auto& micro : micro_batches) widest = std::max(widest, micro.size());
  PipelineStage<float> stage(
      stage_model, groups.chunks(groups.stage()),
      stage_activation_bytes(stage_model.config(), int(widest), longest_sequence));
  if (ep) {
    const int layers = stage_model.config().n_layers;
    stage.set_expert_dispatchers([ep, layers](int) { return ep->reused_dispatchers(layers); });
  }
  const size_t scheduled = size_t(count);
  std::vector<std::vector<const Rollout*>> micro_rollouts(scheduled);
  std::vector<PackedRollouts> packed;
  std::vector<PipelineMicroBatch<float>> batches;
  for (size_t k = 0; k < scheduled; ++k) {
    if (k < micro_batches.size()) {
      for (const size_t i : micro_batches[k]) micro_rollouts[k].push_back(&samples[i]);
    }
    packed.push_back(pack_rollouts(micro_rollouts[k]));
    PipelineMicroBatch<float> batch;
    batch.tokens = packed.back().inputs;
    batch.seq_offsets = packed.back().offsets;
    batches.push_back(std::move(batch));
  }
  // Only the chunk that ends the model runs this, on the last stage.
  const Ops<float>& ops = stage_model.ops();
  stage.set_loss([&](int index, const float* logits, int, int V, Arena& arena, float*) {
    const size_t k = size_t(index);
    if (micro_rollouts[k].empty()) return 0.0f;
    const auto logp = response_logprobs_from_logits(ops, arena, logits, V, packed[k],
                                                    micro_rollouts[k], temperature);
    for (size_t i = 0; i < logp.size(); ++i) samples[micro_batches[k][i]].*into = logp[i];
    return 0.0f;
  });
  PipelineShape shape = layout;
  shape.micro_batches = int(count);
  const PipelineStepStats step =
      run_pipeline_forward(stage, shape, batches, groups.pipeline().comm, groups.links());
  broadcast_from_last_stage(groups, samples, micro_batches, into);
  return step.bytes_sent;
}

uint64_t pipeline_reference_logprobs(Transformer<float>& reference_stage,
                                     const PipelineGroups& groups, std::vector<Rollout>& samples,
                                     const std::vector<size_t>& blocks, int micro_batch,
                                     float temperature, int longest_sequence,
                                     RoleExpertParallel* ep) {
  const SampleMicroBatches micro_batches = block_micro_batches(
      groups, samples.size(), blocks, micro_batch, [](size_t) { return size_t(0); },
      "pipeline_reference_logprobs");
  if (micro_batches.empty() && blocks.empty()) {
    throw std::logic_error("pipeline_reference_logprobs: no samples to make a micro-batch of");
  }
  return pipeline_logprobs(reference_stage, groups, samples, micro_batches,
                           &Rollout::reference_logp, temperature, longest_sequence, ep);
}

uint64_t pipeline_proximal_logprobs(Transformer<float>& policy_stage, const PipelineGroups& groups,
                                    std::vector<Rollout>& samples, const RlStepSettings& settings,
                                    int longest_sequence, RoleExpertParallel* ep) {
  const SampleMicroBatches micro_batches = block_micro_batches(
      groups, samples.size(), settings.block_sizes, settings.micro_batch,
      [&settings](size_t block) {
        return minibatch_begin(block, settings.group_size, settings.minibatches, 1);
      },
      "pipeline_proximal_logprobs");
  return pipeline_logprobs(policy_stage, groups, samples, micro_batches, &Rollout::proximal_logp,
                           settings.temperature, longest_sequence, ep);
}

}  // namespace rlf
