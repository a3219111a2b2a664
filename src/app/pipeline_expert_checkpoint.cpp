#include "src/app/pipeline_expert_checkpoint.h"

#include <array>
#include <vector>

#include "src/runtime/pipeline_layout_switch.h"

namespace rlf {

void write_pipeline_expert_checkpoint(const std::string& run_dir, const ModelConfig& config,
                                      const CheckpointCounters& counters,
                                      const CheckpointTensors& stage, const PipelineGroups& groups,
                                      const RoleExpertParallel& ep,
                                      const CheckpointPlacement& placement) {
  // The other EP replicas hold the same values.
  if (ep.replica() != 0) return;
  // Every layer with this pipeline's experts (slot rows in the placement in force, spare slots
  // included), each buffer gathered from the pipeline's stages onto its first stage (with TP, TP
  // rank 0's), which writes (no other rank holds more than its part).
  const ParameterLayout pipeline_layout = groups.generation_layout();
  const std::array<float*, 4> parts = {stage.parameters, stage.first_moment, stage.second_moment,
                                       stage.reference};
  const bool first_stage = assembles_pipeline_model(groups);
  std::array<std::vector<float>, 4> whole;
  std::array<float*, 4> buffers{};
  for (size_t b = 0; b < parts.size(); ++b) {
    if (!parts[b]) continue;
    if (first_stage) whole[b].resize(size_t(pipeline_layout.total()));
    buffers[b] = first_stage ? whole[b].data() : nullptr;
    gather_pipeline_model(parts[b], groups, buffers[b], pipeline_layout, /*root=*/0);
  }
  // The first stages of the E pipelines are one EP group (world rank 0 its rank 0): together they
  // hold every expert of every layer once. (With TP, TP rank 0's EP group.)
  if (!first_stage) return;
  CheckpointTensors tensors{buffers[0], buffers[1], buffers[2], buffers[3]};
  tensors.in_flight = stage.in_flight;
  // Every stage's EP group follows every layer's table (TrainRebalancer), so the first stage's
  // tables place the experts of all layers.
  if (!ep.slot_experts().empty()) tensors.slot_experts = &ep.slot_experts();
  tensors.placement = &placement;
  write_checkpoint_sharded(run_dir, config, pipeline_layout, counters, tensors, ep.ep_group().comm);
}

}  // namespace rlf
