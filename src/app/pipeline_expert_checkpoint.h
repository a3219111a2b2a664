// Checkpoints of PP x EP training (`train --mode fused --pipeline-parallel P --expert-parallel
// E`): the same whole-model file as every other layout (src/io/checkpoint.h: routed experts stored
// by expert id), written without any rank holding another EP rank's experts. The E pipelines of
// the first EP replica each assemble every layer with their own experts (the layout switch's
// gather inside the pipeline), then their first stages, one EP group, write the file together
// through parallel HDF5, each its experts' rows. On resume each rank reads only its stage's
// layers and its experts' rows (read_checkpoint with the stage's layout), so the file resumes at
// any PP, EP or DP degree.
#pragma once

#include <string>

#include "src/io/checkpoint.h"
#include "src/runtime/pipeline_groups.h"
#include "src/runtime/role_expert_parallel.h"

namespace rlf {

// Writes the checkpoint of `counters.step` from every rank's stage buffers (`stage`, laid out by
// groups.stage_layout(groups.stage()); null buffers are not stored; `stage.in_flight`, given on
// world rank 0 (the first stages' EP group's rank 0), holds StaleSync's pools). Collective over the
// pipelines of EP replica 0 (ep.replica() == 0; other ranks return at once): each gathers its
// stages (collective over the pipeline, counted on groups.links()), then the first stages' EP
// group writes (write_checkpoint_sharded, the experts by id through ep.slot_experts(): every
// stage's EP group follows every layer's placement; with redundant slots each expert's first
// replica), and `placement` (ep's tables, the rebalancer's state) beside them, so that a resumed
// run continues at that placement. `ep`: EP over groups.data_parallel().
void write_pipeline_expert_checkpoint(const std::string& run_dir, const ModelConfig& config,
                                      const CheckpointCounters& counters,
                                      const CheckpointTensors& stage, const PipelineGroups& groups,
                                      const RoleExpertParallel& ep,
                                      const CheckpointPlacement& placement);

}  // namespace rlf
