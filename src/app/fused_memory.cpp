#include "src/app/fused_memory.h"

#include <algorithm>
#include <string>

#include "kernels/arena.h"
#include "kernels/error.h"

namespace rlf {

namespace {

size_t arena_bytes(size_t floats) {
  const size_t a = Arena::kAlignment;
  return (floats * sizeof(float) + a - 1) / a * a;
}

}  // namespace

FusedMemoryPlan plan_fused_memory(const ModelConfig& config, const ParameterLayout& training_layout,
                                  const ParameterLayout& generation_layout, bool layout_switch,
                                  bool reference, size_t reward_model_bytes, bool offload,
                                  int samples, int max_sequence) {
  const size_t params = arena_bytes(size_t(training_layout.total()));
  const size_t reference_bytes = reference ? params : 0;
  const size_t gradients_and_moments = 3 * params;
  const size_t generation_copy = layout_switch ? arena_bytes(size_t(generation_layout.total())) : 0;
  // Keys and values of every layer for every sample at its longest.
  const size_t kv_cache =
      size_t(config.n_layers) * 2 *
      arena_bytes(size_t(samples) * size_t(max_sequence) * size_t(config.d_model));
  FusedMemoryPlan plan;
  plan.reference = reference_bytes;
  plan.reward_model = reward_model_bytes;
  plan.training = params + reference_bytes + reward_model_bytes + gradients_and_moments;
  plan.offload_frees = gradients_and_moments;
  plan.generation = params + reference_bytes + reward_model_bytes + generation_copy + kv_cache +
                    (offload ? 0 : gradients_and_moments);
  return plan;
}

void check_fused_memory_fit(const FusedMemoryPlan& plan, size_t capacity, bool offload,
                            const std::string& mode) {
  if (plan.training <= capacity && plan.generation <= capacity) return;
  std::string message = "--mode " + mode + ": each rank needs " + format_bytes(plan.training) +
                        " of device memory for the training state and " +
                        format_bytes(plan.generation) + " for the generation state" +
                        (offload ? " with --offload" : "");
  if (plan.reference > 0 || plan.reward_model > 0) {
    message += " (each holding the reference model's " + format_bytes(plan.reference) +
               " and the reward model's " + format_bytes(plan.reward_model) + ")";
  }
  message += ", before activations, but --device-memory is " + format_bytes(capacity);
  if (!offload && plan.training <= capacity && plan.generation - plan.offload_frees <= capacity) {
    message += "; --offload would free " + format_bytes(plan.offload_frees) +
               " during generation and make it fit";
  } else {
    message += " (raise --device-memory, or shard the experts with --expert-parallel)";
  }
  throw ConfigError(message);
}

}  // namespace rlf
