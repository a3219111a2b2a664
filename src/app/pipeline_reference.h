// The KL reference's log-probs under pipeline parallelism, through the pipeline itself: a
// forward-only pass over the reference's stages (src/runtime/pipeline_step.h), so that no rank
// holds more of the reference than its stage.
#pragma once

#include <cstdint>
#include <vector>

#include "src/model/transformer.h"
#include "src/rl/rollout.h"
#include "src/runtime/pipeline_groups.h"

namespace rlf {

// Rollout::reference_logp of every one of `samples` (the model replica's samples, the same on
// every rank of it: its ranks' equal blocks in rank order, pipeline_rollouts' order) from the
// reference's stage `reference_stage` (this rank's layers, with TP its TP slice of them; no
// gradients needed): the micro-batches are each block in pieces of `micro_batch` (block_pieces:
// the data-parallel run's micro-batches), run by a forward-only pipeline schedule over the
// stages (all forwards, with virtual stages the chunks in the interleaved order); the last stage
// takes the log-probs at `temperature` from its logits and broadcasts them over the pipeline
// (counted on groups.links()). Activation arenas hold sequences of up to `longest_sequence`
// tokens. Collective over groups.pipeline() (with TP, over the TP groups inside the layers too).
// Returns the activation bytes this rank sent. std::logic_error when the samples are not equal
// blocks that make at least one micro-batch each.
uint64_t pipeline_reference_logprobs(Transformer<float>& reference_stage,
                                     const PipelineGroups& groups, std::vector<Rollout>& samples,
                                     int micro_batch, float temperature, int longest_sequence);

}  // namespace rlf
