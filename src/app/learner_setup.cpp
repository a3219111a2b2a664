#include "src/app/learner_setup.h"

#include <cstring>

#include "src/model/expert_parallel.h"
#include "src/model/tensor_parallel.h"
#include "src/runtime/tensor_expert_parallel.h"

namespace rlf {

WarmStart warm_start_learner(Policy& policy, const RunOptions& run,
                             const PolicyOptions& policy_options, const SftSchedule& sft, bool root,
                             RunDirectory& dir, TraceRecorder& trace) {
  WarmStart result;
  const Task& task = *policy.task;
  auto warm_start = [&](Transformer<float>& m) {
    if (root) result.initial = evaluate_traced(m, task, policy_options, trace);
    run_sft_phase(m, task, sft, dir, trace);
    if (root) {
      result.before_rl =
          sft.steps > 0 ? evaluate_traced(m, task, policy_options, trace) : result.initial;
    }
  };
  Transformer<float>& model = *policy.model;
  if (!stores_part_of_model(model.layout())) {
    warm_start(model);
  } else {
    // Each rank warms up the whole model (the same on every rank) and keeps its part.
    Arena warm_memory("unsharded warm start", run.device_memory_bytes(),
                      policy.device->memory_kind());
    Transformer<float> whole(policy.config, policy.device->ops(), warm_memory, true);
    load_starting_weights(whole, run, policy_options);
    warm_start(whole);
    keep_own_part(whole.parameters(), whole.layout(), model);
  }
  dir.log("# held-out accuracy before RL: %.3f\n", result.before_rl.accuracy());
  return result;
}

std::unique_ptr<RoleExpertParallel> attach_expert_parallel(Transformer<float>& model,
                                                           const HierarchicalComm& role,
                                                           Links& links, int degree,
                                                           DispatchMode mode, int overlap_chunks,
                                                           int redundant_slots) {
  if (degree <= 1) return nullptr;
  auto ep = std::make_unique<RoleExpertParallel>(role, links, model.config().n_experts, degree,
                                                 mode, redundant_slots);
  ep->attach(model, overlap_chunks);
  return ep;
}

namespace {

// The layers `layout` stores: a pipeline stage's reference holds its stage's layers only.
LayerShard stored_layers(const ParameterLayout& layout, int n_layers) {
  LayerShard shard;
  shard.embedding = layout.stores_embedding();
  shard.head = layout.stores_head();
  for (int layer = 0; layer < n_layers; ++layer) {
    if (layout.stores_layer(layer)) shard.layers.push_back(layer);
  }
  if (int(shard.layers.size()) == n_layers) shard.layers.clear();
  return shard;
}

}  // namespace

LearnerState allocate_learner_state(Policy& policy, const RlOptions& rl) {
  LearnerState state;
  Transformer<float>& model = *policy.model;
  const ParameterLayout& layout = model.layout();
  if (rl.kl_coef > 0) {
    state.reference = std::make_unique<Transformer<float>>(
        policy.config, policy.device->ops(), policy.device->memory(), /*with_gradients=*/false,
        ExpertShard{layout.own_experts().first, layout.own_experts().count,
                    layout.redundant_slots()},
        stored_layers(layout, policy.config.n_layers), model.tensor_parallel());
  }
  if (!model.gradients()) {
    state.gradients_mark = policy.device->memory().mark();
    model.allocate_gradients();
  }
  return state;
}

void start_learner_state(LearnerState& state, Policy& policy, const RlOptions& rl,
                         RoleExpertParallel* ep) {
  Transformer<float>& model = *policy.model;
  const ParameterLayout& layout = model.layout();
  if (state.reference) {
    std::memcpy(state.reference->parameters(), model.parameters(),
                size_t(model.parameter_count()) * sizeof(float));
  }
  AdamWHyper hyper;
  hyper.learning_rate = rl.learning_rate;
  state.optimizer = std::make_unique<AdamW<float>>(model, hyper, rl.max_grad_norm);
  if (ep) {
    if (state.reference) ep->attach(*state.reference);
    state.optimizer->set_shard(ep->optimizer_shard(layout));
  }
  if (const TensorParallel* tp = model.tensor_parallel()) {
    state.optimizer->set_shard(ep ? tensor_expert_optimizer_shard(layout, *tp, *ep)
                                  : tp->optimizer_shard(layout));
  }
}

}  // namespace rlf
