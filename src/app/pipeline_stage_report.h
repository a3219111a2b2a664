// What a pipeline-parallel `train` reports about its stages' balance, for the log and
// summary.json: how the layers were cut (--pipeline-balance and the layers per chunk, which pin
// the same cut in another run) and each stage's compute time over the run's pipeline steps.
#pragma once

#include <string>

#include "src/io/run_directory.h"
#include "src/runtime/pipeline_groups.h"

namespace rlf {

// Collective over groups.pipeline(): gathers every stage's `compute_seconds`
// (PipelineTrainer::compute_seconds) inside the pipeline; world rank 0 logs its pipeline's. Returns
// the summary.json fields (ending in a comma): "pipeline_balance", "pipeline_layers_per_chunk",
// "pipeline_stage_compute_seconds" (by stage) and "pipeline_steps_wall_seconds" (this rank's
// `wall_seconds` of the pipeline steps: what a better cut shortens).
std::string pipeline_stage_report(const PipelineGroups& groups, const std::string& balance,
                                  double compute_seconds, double wall_seconds, RunDirectory& dir);

}  // namespace rlf
