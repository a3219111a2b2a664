#include "src/app/pipeline_expert_checkpoint.h"

#include <array>
#include <vector>

#include "src/model/tensor_parallel.h"

namespace rlf {

namespace {

// A communicator freed when it goes out of scope (also when the write throws).
struct OwnedComm {
  MPI_Comm comm = MPI_COMM_NULL;
  ~OwnedComm() {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

}  // namespace

void write_pipeline_expert_checkpoint(const std::string& run_dir, const ModelConfig& config,
                                      const CheckpointCounters& counters,
                                      const CheckpointTensors& stage, const PipelineGroups& groups,
                                      const RoleExpertParallel& ep,
                                      const CheckpointPlacement& placement, MPI_Comm comm) {
  // The writers: the E pipelines of the first EP replica (with TP their TP rank 0s), whose stages
  // hold every layer with every expert once; `comm`'s rank 0 (world rank 0, the writer of the
  // pools in flight) is their rank 0. The other EP replicas hold the same values.
  const TensorParallel* tp = groups.tensor_parallel();
  const bool writes = ep.replica() == 0 && (!tp || tp->rank() == 0);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  OwnedComm writers;
  MPI_Comm_split(comm, writes ? 0 : MPI_UNDEFINED, rank, &writers.comm);
  if (ep.replica() != 0) return;
  // This rank's stage: its layers with its EP rank's slots (spare ones included), whole tensors.
  const ParameterLayout stage_layout = groups.stage_layout(groups.stage());
  std::array<float*, 4> parts = {stage.parameters, stage.first_moment, stage.second_moment,
                                 stage.reference};
  std::array<std::vector<float>, 4> whole_stage;
  if (tp) {
    // Each stage's TP slices come together on its TP rank 0 (counted); the others are done.
    const ParameterLayout sliced = with_tensor_slice(config, stage_layout, tp->slice());
    for (size_t b = 0; b < parts.size(); ++b) {
      if (!parts[b]) continue;
      if (writes) whole_stage[b].resize(size_t(stage_layout.total()));
      gather_tensor_parallel_on_rank_zero(
          parts[b], sliced, writes ? whole_stage[b].data() : nullptr, stage_layout, config, *tp);
      parts[b] = writes ? whole_stage[b].data() : nullptr;
    }
    if (!writes) return;
  }
  // Every stage's EP group follows every layer's table (TrainRebalancer), so each rank's tables
  // place the experts of all layers; the stages write their layers together (parallel HDF5),
  // each rank its experts' rows by id, the lowest rank storing a dense tensor that tensor.
  CheckpointTensors tensors{parts[0], parts[1], parts[2], parts[3]};
  tensors.in_flight = stage.in_flight;
  if (!ep.slot_experts().empty()) tensors.slot_experts = &ep.slot_experts();
  tensors.placement = &placement;
  write_checkpoint_sharded(run_dir, config, stage_layout, counters, tensors, writers.comm);
}

}  // namespace rlf
