// What a fused rank's device arena must hold, counted from the layout before any work: the
// training phase holds the parameters, the reference (KL), gradients and AdamW's two moments;
// with --mode fused-all and a learned reward model, both phases also hold its parameters;
// the generation phase holds the parameters, the reference, the generation-layout copy (with a
// layout switch), the KV cache of its samples, and the gradients and moments unless --offload
// moves them to host memory. Activations and work buffers come on top of these states, so the
// check catches layouts that cannot fit at all, with one message naming the sizes on every rank.
#pragma once

#include <cstddef>
#include <string>

#include "src/model/model_config.h"
#include "src/model/parameter_layout.h"

namespace rlf {

struct FusedMemoryPlan {
  size_t training = 0;       // bytes of the training phase's states
  size_t generation = 0;     // bytes of the generation phase's states (as configured)
  size_t offload_frees = 0;  // gradients and moments, what --offload takes out of generation
  size_t reference = 0;      // the frozen reference (KL), in both phases
  size_t reward_model = 0;   // the learned reward model (fused-all), in both phases
};

// `training_layout` and `generation_layout` are this rank's; `samples` the samples it generates
// at once, each at most `max_sequence` tokens long; `reward_model_bytes` what a reward model in the
// device arena takes (0: none there).
FusedMemoryPlan plan_fused_memory(const ModelConfig& config, const ParameterLayout& training_layout,
                                  const ParameterLayout& generation_layout, bool layout_switch,
                                  bool reference, size_t reward_model_bytes, bool offload,
                                  int samples, int max_sequence);

// ConfigError naming both phases' sizes (and the reference's and reward model's shares), the
// --mode and the capacity when either does not fit `capacity` (and saying whether --offload
// would make generation fit).
void check_fused_memory_fit(const FusedMemoryPlan& plan, size_t capacity, bool offload,
                            const std::string& mode = "fused");

}  // namespace rlf
