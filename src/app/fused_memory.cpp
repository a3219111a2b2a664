#include "src/app/fused_memory.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "kernels/arena.h"
#include "kernels/error.h"
#include "kernels/slot_pool.h"
#include "src/model/activation_memory.h"
#include "src/model/expert_table.h"
#include "src/model/reward_model.h"

namespace rlf {

namespace {

size_t arena_bytes(size_t floats) {
  const size_t a = Arena::kAlignment;
  return (floats * sizeof(float) + a - 1) / a * a;
}

}  // namespace

size_t reward_scoring_peak_bytes(const ModelConfig* reward_model, const FusedBatch& batch) {
  if (!reward_model) return 0;
  // RolloutReward scores whole sequences, --micro-batch at a time (RewardModel::scores).
  return forward_peak_bytes(
      *reward_model, ParameterLayout(*reward_model),
      uniform_batch(std::min(batch.micro_batch, batch.samples), batch.max_sequence));
}

FusedMemoryPlan plan_fused_memory(const ModelConfig& config, const ParameterLayout& training_layout,
                                  const ParameterLayout& generation_layout, bool layout_switch,
                                  bool reference, const ModelConfig* reward_model, bool offload,
                                  const FusedBatch& batch, bool experts_migrate,
                                  ExpertTokenSplit split) {
  const size_t reward_model_bytes = reward_model ? reward_model_parameter_bytes(*reward_model) : 0;
  const size_t params = arena_bytes(size_t(training_layout.total()));
  const size_t reference_bytes = reference ? params : 0;
  const size_t gradients_and_moments = 3 * params;
  FusedMemoryPlan plan;
  if (layout_switch) {
    // The generation view reuses the training parameters; only the experts of the generation
    // shard that the training shard lacks take memory, one pool slot each (layout_switch.h).
    // Training holds experts [first, first + count) at the default placement without replicas;
    // after migrations or with redundant slots (replicas), any stored_experts() distinct ones (a
    // rank's slots never hold an expert twice). With rebalancing, generation's slots may hold any
    // of the experts too (TrainRebalancer::place_generation): the count alone bounds the buckets.
    const ExpertShard held{training_layout.first_expert(), training_layout.stored_experts()};
    const ExpertShard wanted{generation_layout.first_expert(), generation_layout.stored_experts()};
    const int layers = expert_layers(generation_layout);
    const bool any_placement = experts_migrate || training_layout.redundant_slots() > 0;
    const int buckets = any_placement ? expert_buckets_missing_any_placement(
                                            held.count, wanted, config.n_experts, layers)
                                      : expert_buckets_missing(held, wanted, layers);
    plan.received_experts =
        SlotPool::region_bytes(size_t(expert_bucket_elements(config)) * sizeof(float), buckets);
  }
  plan.reference = reference_bytes;
  plan.reward_model = reward_model_bytes;
  plan.training = params + reference_bytes + reward_model_bytes + gradients_and_moments;
  plan.offload_frees = gradients_and_moments;
  plan.generation = params + reference_bytes + reward_model_bytes + plan.received_experts +
                    (offload ? 0 : gradients_and_moments);
  // Every prompt (or resumed prefix) at its longest and every sample at the longest sequence.
  const int longest_prefill = std::max(batch.longest_prompt, batch.longest_prefill);
  plan.generation_activations = generation_peak_bytes(
      config, generation_layout, uniform_batch(batch.samples, longest_prefill), batch.max_sequence,
      batch.sampled, split.generation);
  plan.generation_activations =
      std::max(plan.generation_activations, reward_scoring_peak_bytes(reward_model, batch));
  // A training input is its sequence without the last token.
  const int trained = batch.training_samples > 0 ? batch.training_samples : batch.samples;
  plan.training_activations = training_micro_batch_peak_bytes(
      config, training_layout,
      uniform_batch(std::min(batch.micro_batch, trained), batch.max_sequence - 1), split.training);
  return plan;
}

void add_pipeline_generation_model(FusedMemoryPlan& plan, int64_t parameters) {
  plan.generation_model = arena_bytes(size_t(parameters));
  plan.generation += plan.generation_model;
}

void add_pipeline_activations(FusedMemoryPlan& plan, size_t bytes) {
  plan.pipeline_activations = bytes;
  plan.training_activations = bytes;
}

void check_fused_memory_fit(const FusedMemoryPlan& plan, size_t capacity, bool offload,
                            const std::string& mode) {
  if (plan.training_peak() <= capacity && plan.generation_peak() <= capacity) return;
  std::string message = "--mode " + mode + ": each rank needs " + format_bytes(plan.training) +
                        " of device memory for the training state and " +
                        format_bytes(plan.generation) + " for the generation state" +
                        (offload ? " with --offload" : "");
  if (plan.reference > 0 || plan.reward_model > 0) {
    message += " (each holding the reference model's " + format_bytes(plan.reference) +
               " and the reward model's " + format_bytes(plan.reward_model) + ")";
  }
  if (plan.received_experts > 0) {
    message += ", the generation state with the layout switch's " +
               format_bytes(plan.received_experts) + " of received expert buckets";
  }
  if (plan.generation_model > 0) {
    message += ", the generation state with the pipeline's borrowed generation layers' " +
               format_bytes(plan.generation_model);
  }
  message += "; with " + format_bytes(plan.training_activations) + " of training activations" +
             (plan.pipeline_activations > 0 ? " (the pipeline stage's micro-batch chunks in flight)"
                                            : "") +
             " and " + format_bytes(plan.generation_activations) +
             " of KV cache and generation activations the analytic peaks are " +
             format_bytes(plan.training_peak()) + " (training) and " +
             format_bytes(plan.generation_peak()) + " (generation), but --device-memory is " +
             format_bytes(capacity);
  if (!offload && plan.training_peak() <= capacity &&
      plan.generation_peak() - plan.offload_frees <= capacity) {
    message += "; --offload would free " + format_bytes(plan.offload_frees) +
               " during generation and make it fit";
  } else {
    message +=
        " (raise --device-memory, lower --micro-batch or the prompts per rank, or shard the "
        "experts with --expert-parallel)";
  }
  throw ConfigError(message);
}

std::string device_memory_json(size_t generation_peak, size_t training_peak,
                               const FusedMemoryPlan& plan) {
  char json[256];
  std::snprintf(json, sizeof json,
                "\"device_memory_peaks\":{\"generation\":%zu,\"generation_analytic\":%zu,"
                "\"training\":%zu,\"training_analytic\":%zu},",
                generation_peak, plan.generation_peak(), training_peak, plan.training_peak());
  return json;
}

}  // namespace rlf
