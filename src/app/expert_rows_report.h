// The expert work of an expert-parallel fused run, per rank, for train's log and summary.json: the
// rows each rank's routed experts computed (every forward's dispatches: generation, training, the
// KL reference), so TP x EP's token split shows as each TP rank computing its 1/T share of what
// the duplicated design computes on every TP rank (docs/PARALLELISM.md, "TP x EP").
#pragma once

#include <string>

#include "src/io/run_directory.h"
#include "src/model/tensor_parallel.h"
#include "src/runtime/role_expert_parallel.h"

namespace rlf {

// Collective over MPI_COMM_WORLD: gathers every rank's expert rows (ep.traffic().expert_rows)
// onto rank 0 and logs them; with `tp` also whether its ranks split their tokens and the TP
// allgathers of rows this rank ran. Returns the summary.json fields (ending in a comma):
// "expert_rows_per_rank" and, with `tp`, "tensor_expert_split", "tp_allgathers" and
// "tp_allgathered_elements" (rank 0's).
std::string expert_rows_report(const RoleExpertParallel& ep, const TensorParallel* tp,
                               bool token_split, RunDirectory& dir);

}  // namespace rlf
