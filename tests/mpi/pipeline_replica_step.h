// The pipeline step of the model-parallel MPI tests beside the single-rank step: every pipeline
// runs its share of the same fresh micro-batches, the single-rank model all of them.
#pragma once

#include <mpi.h>

#include <vector>

#include "src/model/pipeline_stage.h"
#include "src/runtime/pipeline_groups.h"
#include "src/runtime/pipeline_step.h"
#include "tests/pipeline_batches.h"
#include "tests/test_util.h"

namespace rlf::test {

struct PipelineStepBeside {
  double loss = 0;            // the pipelines' losses summed over the data-parallel group
  double reference_loss = 0;  // the single-rank step's
  std::vector<PipelineMicroBatch<float>> own;  // this pipeline's micro-batches
  int pairs = 0;                               // this rank's slots run as pairs
};

// groups.shape().micro_batches fresh micro-batches (from `seed`) per pipeline, the same on every
// rank: this rank's pipeline runs its own through the schedule on `stage` (gradients zeroed
// first, left unreduced; with `dispatchers`, its micro-batch chunks dispatch over an EP group;
// with `overlap` too, their MoE layers run in overlapped chunks; `pairing`: its forwards and
// backwards in paired_schedule's pairs), the single-rank `reference` runs all of them (its
// gradients).
inline PipelineStepBeside pipeline_step_beside_reference(
    Transformer<float>& stage, Transformer<float>& reference, const PipelineGroups& groups,
    Links& links, uint64_t seed, PipelineStage<float>::ExpertDispatchers dispatchers = {},
    PipelineStage<float>::ExpertOverlap overlap = {}, bool pairing = false) {
  const int m = groups.shape().micro_batches;
  const float aux_weight = stage.config().aux_loss_coef;
  const auto all =
      random_micro_batches<float>(m * groups.replicas(), stage.config().vocab_size, 9, seed);
  PipelineStepBeside result;
  result.own.assign(all.begin() + groups.replica() * m, all.begin() + (groups.replica() + 1) * m);
  result.reference_loss = reference_step(reference, all, aux_weight);
  PipelineStage<float> pipeline_stage(stage, groups.chunks(groups.stage()), 8 << 20);
  pipeline_stage.set_expert_dispatchers(std::move(dispatchers));
  pipeline_stage.set_expert_overlap(std::move(overlap));
  stage.zero_gradients();
  const PipelineStepStats stats =
      run_pipeline_step(pipeline_stage, groups.shape(), result.own, aux_weight,
                        groups.pipeline().comm, links, pairing);
  result.loss = stats.loss;
  result.pairs = stats.pairs;
  MPI_Allreduce(MPI_IN_PLACE, &result.loss, 1, MPI_DOUBLE, MPI_SUM, groups.data_parallel().comm);
  return result;
}

// `model` (a layout-switched generation model) computes the single-rank `reference`'s logits of
// `batch`, within float rounding.
inline void expect_reference_logits(Transformer<float>& model, Transformer<float>& reference,
                                    const PipelineMicroBatch<float>& batch) {
  const int V = reference.config().vocab_size;
  const std::vector<float> want_logits = [&] {
    const float* l =
        reference.forward(batch.tokens.data(), batch.seq_offsets.data(), batch.sequences());
    return std::vector<float>(l, l + size_t(batch.token_count()) * size_t(V));
  }();
  const float* logits =
      model.forward(batch.tokens.data(), batch.seq_offsets.data(), batch.sequences());
  expect_close(logits, want_logits.data(), want_logits.size(), "generation logits", 1e-5, 1e-4);
}

}  // namespace rlf::test
