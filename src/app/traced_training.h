// The training half of an RL step as every `train` path runs it (one rank, disaggregated
// learners, fused ranks): the frozen reference's log-probs when a KL term is on, then
// optimize_on_rollouts, each traced with the policy version it trains.
#pragma once

#include <vector>

#include "src/io/trace.h"
#include "src/rl/rl_step.h"

namespace rlf {

// Which of how many ranks that train a step this one is: its Train event counts its share of the
// step's tokens (their shares add up to the step's tokens exactly, however many ranks of a TP
// group or a pipeline train the same samples).
struct TokenShare {
  int ranks = 1, index = 0;
  int64_t of(double tokens) const;
};

// `reference` may be null. `share`: this rank's share of the step (the Train event's tokens);
// `gradient` as optimize_on_rollouts takes it. Returns the step's statistics (summed over the
// data-parallel learners by `parallel`).
StepStats train_on_rollouts_traced(Transformer<float>& model, AdamW<float>& optimizer,
                                   Transformer<float>* reference, std::vector<Rollout>& rollouts,
                                   const RlStepSettings& settings,
                                   const DataParallelHooks& parallel, int version, TokenShare share,
                                   TraceRecorder& trace, const MinibatchGradient& gradient = {});

// The router statistics of a run without expert parallelism, as an expert-parallel run records
// its dispatchers' (TrainRebalancer): for each layer this rank stores and routes locally, the
// tokens its training forwards sent to each expert since the last call
// (Transformer::take_local_expert_tokens), recorded for `step` when any. train_on_rollouts_traced
// calls it after each training step.
void record_local_router_loads(Transformer<float>& model, int step, TraceRecorder& trace);

}  // namespace rlf
