// StaleSync's rollout pools generating inside a pipeline (fused `train --staleness s
// --actor-pipeline-parallel P`): each rank keeps its own pool, as in the data-parallel run, and the
// pipeline's stages compute every pool's logits from the layers they store, so no rank borrows
// another stage's layers.
//
// Each rank's pool is a lane of the pipeline. Its owner takes the phase a step at a time
// (RolloutPool::Phase): it sends the step's rows (the running sequences' last tokens, the admitted
// sequences' prompts and responses so far, their cache slots) to the first stage; each virtual
// stage runs its layers over them, decode rows first, and sends the hidden rows on; the last
// stage's logits go back to the owner, which draws the next tokens, decides on continuous batching
// and the long-tail cut as its pool always does, and starts its next step. The P lanes are in the
// pipeline at once, like the P groups of generate_pipelined, and every stage keeps one KV cache a
// lane for its own layers. The owner's decisions do not depend on where the logits were computed,
// so each pool runs the phase generate_phase runs on the whole model (the same samples, cuts and
// steps, up to float rounding of the stages' calls).
//
// The ranks that train together (`ready_over`) end each phase at the first step at which every
// lane is ready, as PoolSettings::all_ranks_ready makes the data-parallel pools agree: here by a
// nonblocking allreduce per step. A lane begins its next step as soon as its logits are in, before
// that agreement, so the lanes stay staggered in the pipeline (waiting would start every round
// with the pipeline's fill); when the ranks agree to end the phase the step begun is undone
// (RolloutPool::Phase::undo_begin_step) and its passes run to the end unused. Every lane thus
// takes the same steps, each of them through the pipeline
// (with no rows if it has none), and every rank runs its passes in one order: by round (the lanes'
// step), then its chunk, then lane. A pass's inputs come from passes earlier in that order, so no
// rank waits on one that waits on it; the ranks of a stage's TP group make their collective calls
// in the same order, and so do its EP mates (the same stage in other pipelines, running other
// samples: with EP every pass makes its decode and prefill calls, with no rows if need be).
//
// Every message is a point-to-point send (posted, counted on the Links and delayed by their
// emulation).
#pragma once

#include <mpi.h>

#include <vector>

#include "mpi_comm/links.h"
#include "src/model/pipeline_stage.h"
#include "src/rl/rollout_pool.h"

namespace rlf {

// Collective over `pipeline` (rank = pipeline stage, size P >= 2) and `ready_over` (not
// MPI_COMM_NULL): one phase of this rank's `pool` (RolloutPool::generate_phase's arguments;
// settings.all_ranks_ready must be empty: `ready_over` replaces it) with `stage` storing the layers
// of `chunks` (as generate_pipelined), the embedding on rank 0 and the head on rank P - 1. With TP
// (or EP) inside the stages every rank of the TP (EP) group calls this at once; a TP group's ranks
// hold alike pools. Returns this rank's phase's stats.
PhaseStats generate_phase_pipelined(RolloutPool& pool, Transformer<float>& stage,
                                    const std::vector<LayerRange>& chunks,
                                    const GenerationSettings& sampling, int version,
                                    const PoolSettings& settings, MPI_Comm ready_over,
                                    MPI_Comm pipeline, Links& links);

}  // namespace rlf
