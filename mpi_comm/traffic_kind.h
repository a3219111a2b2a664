// What a message is for: the runtime's traffic split by purpose, beside the split by link class,
// so that a run's bytes can be checked purpose by purpose against the planner's byte rules
// (src/sim/counted_bytes.h) and a user sees which algorithm moved them. Links counts every send
// under the kind of the innermost TrafficScope open on the rank (Other outside any).
#pragma once

#include <array>
#include <cstddef>

namespace rlf {

enum class TrafficKind {
  Other = 0,
  WeightSync,           // disaggregated: the learners' weights to the actors
  GradientReduce,       // the data-parallel ranks' gradient all-reduce
  RolloutQueue,         // DistQueue: rollouts from generation to training, hand-offs in a replica
  ExpertDispatch,       // EP dispatch, combine and their backwards (rows and metadata)
  ExpertMigration,      // EDPB: expert weights moving between EP ranks
  PipelineActivations,  // training's activations and gradients between pipeline stages
  PipelineGeneration,   // generation inside a pipeline: hidden rows and sampled tokens
  LayoutSwitch,         // weights between the training and the generation layout
  TensorParallel,       // TP's collectives inside a layer
  FinalGather,          // the end of a run: the whole model gathered for model.h5
};
inline constexpr std::size_t kTrafficKinds = 11;

// A short name for tables, CSV columns and JSON keys ("gradient_reduce", ...).
inline const char* traffic_kind_name(TrafficKind kind) {
  switch (kind) {
    case TrafficKind::Other:
      return "other";
    case TrafficKind::WeightSync:
      return "weight_sync";
    case TrafficKind::GradientReduce:
      return "gradient_reduce";
    case TrafficKind::RolloutQueue:
      return "rollout_queue";
    case TrafficKind::ExpertDispatch:
      return "expert_dispatch";
    case TrafficKind::ExpertMigration:
      return "expert_migration";
    case TrafficKind::PipelineActivations:
      return "pipeline_activations";
    case TrafficKind::PipelineGeneration:
      return "pipeline_generation";
    case TrafficKind::LayoutSwitch:
      return "layout_switch";
    case TrafficKind::TensorParallel:
      return "tensor_parallel";
    case TrafficKind::FinalGather:
      return "final_gather";
  }
  return "unknown";
}

inline constexpr std::array<TrafficKind, kTrafficKinds> all_traffic_kinds() {
  return {TrafficKind::Other,
          TrafficKind::WeightSync,
          TrafficKind::GradientReduce,
          TrafficKind::RolloutQueue,
          TrafficKind::ExpertDispatch,
          TrafficKind::ExpertMigration,
          TrafficKind::PipelineActivations,
          TrafficKind::PipelineGeneration,
          TrafficKind::LayoutSwitch,
          TrafficKind::TensorParallel,
          TrafficKind::FinalGather};
}

}  // namespace rlf
