// What a fused rank's device arena must hold, counted from the layout before any work: the
// training phase holds the parameters, the reference (KL), gradients and AdamW's two moments;
// with --mode fused-all and a learned reward model, both phases also hold its parameters;
// the generation phase holds the parameters, the reference, with a layout switch the expert
// buckets its generation view receives (the view reuses every parameter the rank holds: no copy),
// and the gradients and moments unless --offload moves them to host memory.
// On top of these states come each phase's analytic activation peak (src/model/
// activation_memory.h): generation's KV cache, prefill or decode activations, logits and sampling
// buffers, or the reward model's scoring forward when larger; training's largest micro-batch,
// forward activations to the backward's work. The check stops a layout whose peak cannot fit with
// one message naming the sizes on every rank.
#pragma once

#include <cstddef>
#include <string>

#include "src/model/model_config.h"
#include "src/model/parameter_layout.h"

namespace rlf {

struct FusedMemoryPlan {
  size_t training = 0;              // bytes of the training phase's states
  size_t generation = 0;            // bytes of the generation phase's states (as configured)
  size_t offload_frees = 0;         // gradients and moments, what --offload takes out of generation
  size_t reference = 0;             // the frozen reference (KL), in both phases
  size_t reward_model = 0;          // the learned reward model (fused-all), in both phases
  size_t received_experts = 0;      // a layout switch's received expert buckets (generation)
  size_t generation_model = 0;      // a pipeline stage's whole generation model (generation)
  size_t training_activations = 0;  // analytic peak of the largest training micro-batch
  // With pipeline parallelism: training_activations are the stage's activation arenas (the micro-
  // batch chunks in flight), add_pipeline_activations; 0 otherwise.
  size_t pipeline_activations = 0;
  size_t generation_activations = 0;  // analytic peak of generation, KV cache included

  size_t training_peak() const { return training + training_activations; }
  size_t generation_peak() const { return generation + generation_activations; }
};

// A fused rank's generation and training batches: `samples` generated at once, prompts of at most
// `longest_prompt` tokens, sequences of at most `max_sequence`; training micro-batches of
// `micro_batch` samples; `sampled`: temperature > 0; `longest_prefill`: the longest sequence a
// prefill holds, when longer than a prompt (0: longest_prompt). StaleSync's rollout pool prefills
// the partial samples it resumes with their prompt and response so far (the recomputed prefix):
// the runtime's bound is max_sequence - 1 (a partial has yet to draw its last token).
struct FusedBatch {
  int samples = 0;
  int longest_prompt = 0;
  int max_sequence = 0;
  int micro_batch = 1;
  bool sampled = true;
  int longest_prefill = 0;
  // Samples one rank may train in a step when that differs from what it generates (data
  // reordering can bring it any of the step's samples); 0: `samples`.
  int training_samples = 0;
};

// The analytic peak of scoring `batch`'s samples with a learned reward model of `reward_model`'s
// config (0 without one): whole sequences, --micro-batch at a time.
size_t reward_scoring_peak_bytes(const ModelConfig* reward_model, const FusedBatch& batch);

// `training_layout` and `generation_layout` are this rank's; `reward_model` the config of a learned
// reward model in the device arena (null: none there), which scores each generation's samples in
// micro-batches after the KV cache is gone. `experts_migrate` (--rebalance-every): the training
// placement can become any, so the switch's received buckets are counted for the worst one (so
// too with the redundant slots of a slot-space training layout: its replicas are the planner's).
// `split`: where the routed experts run on the rank's share of its TP group's tokens
// (Transformer::set_expert_token_split), counted at that share.
struct ExpertTokenSplit {
  bool training = false, generation = false;
};
FusedMemoryPlan plan_fused_memory(const ModelConfig& config, const ParameterLayout& training_layout,
                                  const ParameterLayout& generation_layout, bool layout_switch,
                                  bool reference, const ModelConfig* reward_model, bool offload,
                                  const FusedBatch& batch, bool experts_migrate = false,
                                  ExpertTokenSplit split = {});

// With pipeline parallelism a stage generates from `parameters` of its own received into the
// device arena next to the stage for the generation phase only: the other stages' layers (a
// stitched view with its own), or a whole model (every layer, with EP the pipeline's experts:
// PipelineGroups::generation_layout; with TP its slice). The stage's gradients and moments still
// leave with --offload: they are the stage's.
void add_pipeline_generation_model(FusedMemoryPlan& plan, int64_t parameters);

// A pipeline stage trains its micro-batch chunks in activation arenas of their own, several in
// flight at once (pipeline_activation_bytes, src/app/pipeline_parallel_train.h): they replace the
// whole-model micro-batch of the training activations.
void add_pipeline_activations(FusedMemoryPlan& plan, size_t bytes);

// ConfigError naming both phases' states and analytic peaks (and the reference's and reward
// model's shares), the --mode and the capacity when either peak does not fit `capacity` (and
// saying whether --offload would make generation fit).
void check_fused_memory_fit(const FusedMemoryPlan& plan, size_t capacity, bool offload,
                            const std::string& mode = "fused");

// summary.json's fragment (ending in a comma) with a run's measured phase peaks next to the plan's
// analytic ones, in bytes.
std::string device_memory_json(size_t generation_peak, size_t training_peak,
                               const FusedMemoryPlan& plan);

}  // namespace rlf
