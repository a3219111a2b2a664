// The analytic device-arena peak of a generation phase and of a training micro-batch: every
// activation, work buffer and kernel scratch the code allocates (cpu backend), counted from the
// model config, the parameter layout and the batch's lengths, so that a layout's memory can be
// planned before any work and checked against the arena's measured phase peak. A layout with a
// tensor slice counts a TP rank's: its heads' Q, K, V, attention output, KV cache and their
// gradients, its slice of the shared expert; with `expert_token_split`
// (Transformer::set_expert_token_split, TP alone or TP x EP) its share of the routed rows. An
// expert-sharded layout counts the balanced share of its EP group's rows (what a uniform router
// gives on average: a rank receiving more holds more).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "src/model/model_config.h"
#include "src/model/parameter_layout.h"

namespace rlf {

// The lengths of a packed batch that the allocations depend on.
struct PackedBatch {
  std::vector<int> lengths;  // of the sequences, in order (attention runs in pieces of them)
  int sequences = 0;
  int64_t tokens = 0;
  int64_t query_blocks = 0;  // sum over sequences of ceil(length / 64): attention's work items
  int longest = 0;
};

PackedBatch packed_batch(const std::vector<int>& lengths);
// `sequences` sequences of `length` tokens each.
PackedBatch uniform_batch(int sequences, int length);

// Bytes generate() (src/model/generation.h) allocates above the arena's use at its call, at its
// highest: the KV cache of every prompt at `max_len` tokens, then the larger of the prefill of
// `prompts` and a decode step of all of them, each with its logits and sampling buffers
// (`sampled`: temperature > 0). With an expert-sharded `layout` (expert parallelism) each rank's
// routed rows are counted at their balanced share (top_k rows per token).
size_t generation_peak_bytes(const ModelConfig& config, const ParameterLayout& layout,
                             const PackedBatch& prompts, int max_len, bool sampled,
                             bool expert_token_split = false);

// Bytes generate_pipelined() (src/runtime/pipeline_generation.h) allocates on a pipeline stage
// storing `layout`'s layers, at its highest: the KV cache of those layers for all `cache_slots`
// sequences of the pipeline, then one prefill piece's pass (`prefill_piece`: its prompts) or a
// decode step of one group (`group_sequences` rows) with the hidden rows it received, and on the
// last stage the head and the sampling. With a TP
// `layout`, its slices; `expert_token_split`: each TP rank computes its share of the rows' routed
// experts (Transformer::set_expert_token_split).
size_t pipeline_generation_peak_bytes(const ModelConfig& config, const ParameterLayout& layout,
                                      const PackedBatch& prefill_piece, int group_sequences,
                                      int cache_slots, int max_len, bool sampled,
                                      bool expert_token_split = false);

// Bytes Transformer::forward (saved activations and logits) allocates for `inputs` at its
// highest: what scoring a batch with a learned reward model holds (src/model/reward_model.h).
size_t forward_peak_bytes(const ModelConfig& config, const ParameterLayout& layout,
                          const PackedBatch& inputs);

// Bytes accumulate_policy_gradient() (src/rl/policy_loss.h) allocates above the arena's use at its
// call, at its highest: the forward activations of `inputs` (each sequence without its last token)
// saved for backward, logits, the policy loss's work buffers and the backward of the last layer.
size_t training_micro_batch_peak_bytes(const ModelConfig& config, const ParameterLayout& layout,
                                       const PackedBatch& inputs, bool expert_token_split = false);

// Bytes one micro-batch chunk takes in a pipeline stage's activation arena (PipelineStage, src/
// model/pipeline_stage.h) through its forward and backward, at its highest: layers [first, last)
// of `inputs` (each sequence without its last token) with their activations saved for the
// backward (the embedding's tokens when first is 0), and, when the chunk ends the model, the
// logits, their gradient and the policy loss's work buffers (policy_loss_gradient); then the
// backward's work. The arenas of the chunks a stage holds at once (pipeline_schedule.h,
// in_flight_bound) together hold at most that many of these.
size_t pipeline_chunk_peak_bytes(const ModelConfig& config, const ParameterLayout& layout,
                                 const PackedBatch& inputs, int first, int last,
                                 bool expert_token_split = false);

}  // namespace rlf
