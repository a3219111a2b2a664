// How long an expert-parallel run's ranks spent in the MoE layers' exchanges (dispatch and
// combine, forward and backward, in generation and training; disaggregated: each rank in its
// role's, learners' or actors'), per rank, for train's log and summary.json: the figure to set
// beside the planner's EP terms (docs/DEPLOYMIND.md) when a run is slower than predicted. A fused
// PP x EP run reports its schedule's instead (pipeline_ep_overlap_report.h).
#pragma once

#include <string>

#include "mpi_comm/split_phase.h"
#include "src/io/run_directory.h"

namespace rlf {

// Collective over MPI_COMM_WORLD: gathers every rank's `mine` (its dispatchers' communication
// time over the run, RoleExpertParallel::communication_time, training's and generation's layouts
// summed) and `rl_seconds` (this process's RL wall time) onto rank 0, logs one line per rank, and
// returns the summary.json fields (ending in a comma) "ep_exchange_seconds" (in flight: from each
// operation's begin to its completion) and "ep_exchange_exposed_seconds" (the rank held up by
// them), per rank.
std::string ep_exchange_report(const SplitPhaseChain::Time& mine, double rl_seconds,
                               RunDirectory& dir);

}  // namespace rlf
