#include "src/app/traced_training.h"

#include <algorithm>
#include <cmath>

namespace rlf {

int64_t TokenShare::of(double tokens) const {
  const int64_t total = std::llround(tokens);
  return total / ranks + (index < total % ranks ? 1 : 0);
}

StepStats train_on_rollouts_traced(Transformer<float>& model, AdamW<float>& optimizer,
                                   Transformer<float>* reference, std::vector<Rollout>& rollouts,
                                   const RlStepSettings& settings,
                                   const DataParallelHooks& parallel, int version, TokenShare share,
                                   TraceRecorder& trace, const MinibatchGradient& gradient) {
  if (reference) {
    TraceScope traced(trace, Phase::Reference);
    traced.set_version(version);
    attach_reference_logprobs(*reference, rollouts, settings.micro_batch, settings.temperature,
                              parallel);
  }
  if (settings.ppo.decoupled && settings.minibatches > 1 && !settings.proximal_attached) {
    TraceScope traced(trace, Phase::Proximal);
    traced.set_version(version);
    attach_proximal_logprobs(model, rollouts, settings, parallel);
  }
  for (const Rollout& r : rollouts)
    trace.record_trained(r.sample_id, r.version_min, r.version_max, version,
                         int32_t(r.prompt.size()), int32_t(r.response.size()));
  TraceScope traced(trace, Phase::Train);
  traced.set_version(version);
  const StepStats stats =
      optimize_on_rollouts(model, optimizer, rollouts, settings, parallel, gradient);
  traced.set_tokens(share.of(stats.tokens));
  record_local_router_loads(model, version, trace);
  return stats;
}

void record_local_router_loads(Transformer<float>& model, int step, TraceRecorder& trace) {
  const ModelConfig& config = model.config();
  for (int l = 0; l < config.n_layers; ++l) {
    // (Another stage's layers: that stage records them. A dispatcher's layer: TrainRebalancer.)
    if (!model.layout().stores_layer(l) || model.expert_dispatcher(l)) continue;
    const std::vector<int64_t> tokens = model.take_local_expert_tokens(l);
    if (std::all_of(tokens.begin(), tokens.end(), [](int64_t t) { return t == 0; })) continue;
    for (int e = 0; e < config.n_experts; ++e)
      trace.record_router_load({step, l, e, tokens[size_t(e)]});
  }
}

}  // namespace rlf
