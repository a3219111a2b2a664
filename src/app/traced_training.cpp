#include "src/app/traced_training.h"

namespace rlf {

StepStats train_on_rollouts_traced(Transformer<float>& model, AdamW<float>& optimizer,
                                   Transformer<float>* reference, std::vector<Rollout>& rollouts,
                                   const RlStepSettings& settings,
                                   const DataParallelHooks& parallel, int version, int learners,
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
    trace.record_trained(r.sample_id, r.version_min, r.version_max, version);
  TraceScope traced(trace, Phase::Train);
  traced.set_version(version);
  const StepStats stats =
      optimize_on_rollouts(model, optimizer, rollouts, settings, parallel, gradient);
  traced.set_tokens(int64_t(stats.tokens / double(learners)));
  return stats;
}

}  // namespace rlf
