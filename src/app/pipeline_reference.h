// Log-probs under pipeline parallelism through the pipeline itself: a forward-only pass over a
// model's stages (src/runtime/pipeline_step.h), so that no rank holds more of the model than its
// stage. The KL reference's log-probs of every sample, and with StaleSync and several minibatches
// the decoupled objective's proximal ones (the policy's at the start of the step) of the samples
// after each rank's first minibatch; with EP inside the stages, in step with the EP mates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "src/model/transformer.h"
#include "src/rl/rl_step.h"
#include "src/rl/rollout.h"
#include "src/runtime/pipeline_groups.h"
#include "src/runtime/role_expert_parallel.h"

namespace rlf {

// Micro-batches as lists of sample indices (a list may skip samples: the proximal pass's).
using SampleMicroBatches = std::vector<std::vector<size_t>>;

// Rollout::*`into` of the samples of `micro_batches` (the model replica's samples, the same on
// every rank of it), computed at `temperature` by a forward-only pipeline schedule over the
// stages of `stage_model` (this rank's layers, with TP its TP slice of them; gradients unused):
// all forwards, with virtual stages the chunks in the interleaved order (the micro-batches padded
// with empty ones to a multiple of the stages); the last stage takes the log-probs from its logits
// and broadcasts them over the pipeline (counted on groups.links()). Every sample's `into` is
// cleared first. With `ep` (EP inside the stages), every MoE layer dispatches over the EP group
// through ep->reused_dispatchers (outside the router statistics), every pipeline running the
// largest micro-batch count of the stage's data-parallel group (the extra ones empty). Activation
// arenas hold sequences of up to `longest_sequence` tokens. Collective over groups.pipeline()
// (with TP, the TP groups inside the layers; with EP, groups.data_parallel() and the EP group).
// Returns the activation bytes this rank sent.
uint64_t pipeline_logprobs(Transformer<float>& stage_model, const PipelineGroups& groups,
                           std::vector<Rollout>& samples, const SampleMicroBatches& micro_batches,
                           std::vector<float> Rollout::*into, float temperature,
                           int longest_sequence, RoleExpertParallel* ep = nullptr);

// Rollout::reference_logp of every one of `samples` from the reference's stage
// `reference_stage`, in the data-parallel run's micro-batches: each rank's block (`blocks`, the
// replica's ranks' sample counts in rank order; empty: equal blocks) in pieces of `micro_batch`.
// std::logic_error when the samples are not `blocks`, or without them not equal blocks that make
// at least one micro-batch (StaleSync's blocks may all be empty on a pipeline whose ranks finished
// no group: with EP it still takes part).
uint64_t pipeline_reference_logprobs(Transformer<float>& reference_stage,
                                     const PipelineGroups& groups, std::vector<Rollout>& samples,
                                     const std::vector<size_t>& blocks, int micro_batch,
                                     float temperature, int longest_sequence,
                                     RoleExpertParallel* ep = nullptr);

// StaleSync with several minibatches: Rollout::proximal_logp of the samples after each rank's
// first minibatch (settings.block_sizes: the replica's ranks' sample counts; minibatch_begin
// within each block), from the policy's stage `policy_stage` before the step trains, in the
// micro-batches in which the data-parallel rank computes them (attach_proximal_logprobs); the
// first minibatch's samples carry none (their own forward anchors them).
uint64_t pipeline_proximal_logprobs(Transformer<float>& policy_stage, const PipelineGroups& groups,
                                    std::vector<Rollout>& samples, const RlStepSettings& settings,
                                    int longest_sequence, RoleExpertParallel* ep = nullptr);

}  // namespace rlf
