// The EP communication of a PP x EP run's schedule, per rank, for train's log and summary.json:
// how long the MoE layers' dispatches and combines were in flight, how much of that held the rank
// up, and the hidden fraction (docs/PARALLELISM.md, "Overlap inside the pipeline stages").
#pragma once

#include <string>

#include "mpi_comm/split_phase.h"
#include "src/io/run_directory.h"

namespace rlf {

// Collective over MPI_COMM_WORLD: gathers every rank's `mine` (the run's EP communication time,
// PipelineTrainer::ep_communication) onto rank 0, logs one line per rank, and returns the
// summary.json fields (ending in a comma): "ep_overlap_chunks", and per rank
// "pipeline_pairs" (forward / backward pairs run, --pipeline-pairing), "ep_communication_seconds",
// "ep_exposed_seconds" and "ep_hidden_fraction".
std::string pipeline_ep_overlap_report(const SplitPhaseChain::Time& mine, int overlap_chunks,
                                       int pairs, RunDirectory& dir);

}  // namespace rlf
