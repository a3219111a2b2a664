// What a fused rank's device arena must hold, counted from the layout before any work: the
// training phase holds the parameters, the reference (KL), gradients and AdamW's two moments;
// the generation phase holds the parameters, the reference, the generation-layout copy (with a
// layout switch), the KV cache of its samples, and the gradients and moments unless --offload
// moves them to host memory. Activations and work buffers come on top of these states, so the
// check catches layouts that cannot fit at all, with one message naming the sizes on every rank.
#pragma once

#include <cstddef>

#include "src/model/model_config.h"
#include "src/model/parameter_layout.h"

namespace rlf {

struct FusedMemoryPlan {
  size_t training = 0;       // bytes of the training phase's states
  size_t generation = 0;     // bytes of the generation phase's states (as configured)
  size_t offload_frees = 0;  // gradients and moments, what --offload takes out of generation
};

// `training_layout` and `generation_layout` are this rank's; `samples` the samples it generates
// at once, each at most `max_sequence` tokens long.
FusedMemoryPlan plan_fused_memory(const ModelConfig& config, const ParameterLayout& training_layout,
                                  const ParameterLayout& generation_layout, bool layout_switch,
                                  bool reference, bool offload, int samples, int max_sequence);

// ConfigError naming both phases' sizes and the capacity when either does not fit `capacity`
// (and saying whether --offload would make generation fit).
void check_fused_memory_fit(const FusedMemoryPlan& plan, size_t capacity, bool offload);

}  // namespace rlf
