// The routed-expert work of an expert- or tensor-parallel fused run, per rank, for train's log and
// summary.json: the rows each rank's routed experts computed (every forward's: generation,
// training, the KL reference), so the token split shows as each TP rank computing its 1/T share
// of what the duplicated design computes on every TP rank (docs/PARALLELISM.md, "TP x EP").
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "src/io/run_directory.h"
#include "src/model/tensor_parallel.h"
#include "src/model/transformer.h"

namespace rlf {

// Collective over MPI_COMM_WORLD: gathers every rank's expert rows (`rows`: with EP the
// dispatcher's, ep.traffic().expert_rows; without, the rows its own experts computed,
// Transformer::local_routed_rows of the policy and the reference) onto rank 0 and logs them;
// with `tp` also whether its ranks split their tokens and the TP allgathers of rows this rank ran.
// Returns the summary.json fields (ending in a comma): "expert_rows_per_rank" and, with `tp`,
// "tensor_expert_split", "tp_allgathers" and "tp_allgathered_elements" (rank 0's).
std::string expert_rows_report(int64_t rows, const TensorParallel* tp, bool token_split,
                               RunDirectory& dir);

// Collective over MPI_COMM_WORLD: the routed experts the ranks' training forwards without a
// dispatcher (SFT's included) gave rows to, a (layer, call) on average over every rank's
// (Transformer::take_touched_experts: taken); 0 when no such call ran (with EP the dispatchers
// route). The planner's job.active_experts.
double touched_experts_per_call(Transformer<float>& model);
// That mean as the summary.json field "active_experts_per_call" (ending in a comma), or nothing
// for 0; and as the trace's metadata of the same name (`rlfusion report` prints it for the plan).
std::string touched_experts_json(double per_call);
void add_touched_experts(std::map<std::string, std::string>& metadata, double per_call);

}  // namespace rlf
