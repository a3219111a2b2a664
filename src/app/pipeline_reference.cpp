#include "src/app/pipeline_reference.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "src/app/pipeline_parallel_train.h"
#include "src/model/pipeline_stage.h"
#include "src/rl/policy_loss.h"
#include "src/runtime/pipeline_step.h"

namespace rlf {

namespace {

// The last stage's log-probs onto every rank of the pipeline, in the samples' order.
void broadcast_from_last_stage(const PipelineGroups& groups, std::vector<Rollout>& samples) {
  const HierarchicalComm& pipeline = groups.pipeline();
  const int last = pipeline.size() - 1;
  std::vector<float> all;
  for (const Rollout& r : samples)
    all.insert(all.end(), r.reference_logp.begin(), r.reference_logp.end());
  size_t total = 0;
  for (const Rollout& r : samples) total += r.response.size();
  if (pipeline.rank() == last && all.size() != total) {
    throw std::logic_error("pipeline_reference_logprobs: the last stage lacks log-probs");
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
  for (Rollout& r : samples) {
    r.reference_logp.assign(all.begin() + std::ptrdiff_t(at),
                            all.begin() + std::ptrdiff_t(at + r.response.size()));
    at += r.response.size();
  }
}

}  // namespace

uint64_t pipeline_reference_logprobs(Transformer<float>& reference_stage,
                                     const PipelineGroups& groups, std::vector<Rollout>& samples,
                                     int micro_batch, float temperature, int longest_sequence) {
  const int blocks = groups.model_parallel().size();
  const auto bounds = block_pieces(samples.size(), blocks, micro_batch);
  if (bounds.empty() || samples.size() % size_t(blocks) != 0) {
    throw std::logic_error("pipeline_reference_logprobs: " + std::to_string(samples.size()) +
                           " samples are not " + std::to_string(blocks) + " equal blocks");
  }
  const int block = int(samples.size()) / blocks;
  PipelineStage<float> stage(
      reference_stage, groups.chunks(groups.stage()),
      stage_activation_bytes(reference_stage.config(), std::min(micro_batch, block),
                             longest_sequence));
  std::vector<std::vector<const Rollout*>> micro_rollouts;
  std::vector<PackedRollouts> packed;
  std::vector<PipelineMicroBatch<float>> batches;
  for (const auto& [begin, end] : bounds) {
    micro_rollouts.emplace_back();
    for (size_t i = begin; i < end; ++i) micro_rollouts.back().push_back(&samples[i]);
    packed.push_back(pack_rollouts(micro_rollouts.back()));
    PipelineMicroBatch<float> batch;
    batch.tokens = packed.back().inputs;
    batch.seq_offsets = packed.back().offsets;
    batches.push_back(std::move(batch));
  }
  for (Rollout& r : samples) r.reference_logp.clear();
  // Only the chunk that ends the model runs this, on the last stage.
  const Ops<float>& ops = reference_stage.ops();
  stage.set_loss([&](int index, const float* logits, int, int V, Arena& arena, float*) {
    const auto logp = response_logprobs_from_logits(ops, arena, logits, V, packed[size_t(index)],
                                                    micro_rollouts[size_t(index)], temperature);
    const size_t first = bounds[size_t(index)].first;
    for (size_t i = 0; i < logp.size(); ++i) samples[first + i].reference_logp = logp[i];
    return 0.0f;
  });
  PipelineShape shape = groups.shape();
  shape.micro_batches = int(batches.size());
  const PipelineStepStats step =
      run_pipeline_forward(stage, shape, batches, groups.pipeline().comm, groups.links());
  broadcast_from_last_stage(groups, samples);
  return step.bytes_sent;
}

}  // namespace rlf
