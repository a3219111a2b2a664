// Checkpoints of PP x EP training (`train --mode fused --pipeline-parallel P --expert-parallel
// E`): the same whole-model file as every other layout (src/io/checkpoint.h: routed experts stored
// by expert id), written without any rank holding another rank's part. The stages of the E
// pipelines of the first EP replica write the file together through parallel HDF5, each its
// layers with its experts' rows (with TP, after each stage's slices came together on its TP rank
// 0). On resume each rank reads only its stage's layers and its experts' rows (read_checkpoint
// with the stage's layout), so the file resumes at any PP, EP or DP degree.
#pragma once

#include <mpi.h>

#include <string>

#include "src/io/checkpoint.h"
#include "src/runtime/pipeline_groups.h"
#include "src/runtime/role_expert_parallel.h"

namespace rlf {

// Writes the checkpoint of `counters.step` from every rank's stage buffers (`stage`, laid out by
// groups.stage_layout(groups.stage()), with TP its slice of it; null buffers are not stored;
// `stage.in_flight`, given on world rank 0, holds StaleSync's pools). Collective over `comm` (every
// rank of the run: the writers' communicator is split from it); the ranks of EP replica 0
// (ep.replica() == 0) write: with TP each stage's slices are first gathered on its TP rank 0
// (counted on the TP group's links), then the E x P writers call write_checkpoint_sharded with
// their stage layouts, the experts by id through ep.slot_experts() (every stage's EP group follows
// every layer's placement; with redundant slots each expert's first replica), and `placement`
// (ep's tables, the rebalancer's state) beside them, so that a resumed run continues at that
// placement. `ep`: EP over groups.data_parallel().
void write_pipeline_expert_checkpoint(const std::string& run_dir, const ModelConfig& config,
                                      const CheckpointCounters& counters,
                                      const CheckpointTensors& stage, const PipelineGroups& groups,
                                      const RoleExpertParallel& ep,
                                      const CheckpointPlacement& placement, MPI_Comm comm);

}  // namespace rlf
