// One training step of a pipeline-parallel model on this rank: the rank's passes in the order of
// its schedule (src/runtime/pipeline_schedule.h), activations and their gradients exchanged with
// the neighbouring virtual stages by nonblocking MPI point-to-point (receives posted ahead,
// sends completed in the background, every message counted on the Links counters and delayed by
// their emulation), gradients accumulated over the micro-batches. Also what the step measured:
// the time this rank waited for activations and gradients, beside the step's wall time.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "mpi_comm/links.h"
#include "src/model/pipeline_stage.h"
#include "src/runtime/pipeline_schedule.h"

namespace rlf {

// Chunk k of pipeline rank r under chunk `boundaries` (p v + 1 layer indices, virtual stage s
// holding layers [boundaries[s], boundaries[s + 1])): virtual stage k p + r.
std::vector<LayerRange> pipeline_rank_chunks(const PipelineShape& shape, int rank,
                                             const std::vector<int>& boundaries);

struct PipelineStepStats {
  // Summed over the pipeline (the same on every rank): the weighted NLL of every micro-batch plus
  // aux_weight times the router load-balancing loss of every micro-batch (times its aux_scale) and
  // layer.
  double loss = 0;
  double wall_seconds = 0;     // from a common start to a common end (quiet barriers)
  double compute_seconds = 0;  // inside this rank's forward and backward passes (and the loss)
  // The process's CPU time over the same passes (all its threads): compute_seconds well above it
  // means the rank lost its core to other processes; two ranks' CPU times apart mean their chunks
  // cost differently.
  double compute_cpu_seconds = 0;
  // compute_seconds by local chunk (0 .. v - 1): what the schedule's passes of each virtual stage
  // cost on this rank, for simulate_schedule with measured costs.
  std::vector<double> forward_seconds, backward_seconds;
  // Blocked: on the activations and gradients it receives, on its sends, and at the end for the
  // slowest rank (the time this rank has nothing to do).
  double wait_seconds = 0;
  uint64_t bytes_sent = 0, messages_sent = 0;
  int in_flight_peak = 0;  // micro-batch chunks held at once (the stage's activation arenas)
  int pairs = 0;           // slots that ran a forward and a backward as a pair (pairing)
  int floor_overruns = 0;  // passes whose own work outlasted their PassFloor (none without one)
  double bubble() const { return wall_seconds > 0 ? wait_seconds / wall_seconds : 0; }
};

// The least time a pass of the step takes: a pass that ends sooner spins (holding its core)
// until `forward` or `backward` seconds after it began. `bench pipeline` paces every stage's
// passes to one floor so that the stages cost the same, as the bubble formula assumes, and the
// measured bubble then tests the schedule and the runtime's own overhead apart from the stages'
// imbalance. Zero (the default): passes take what their work takes.
struct PassFloor {
  double forward = 0, backward = 0;
  bool any() const { return forward > 0 || backward > 0; }
};

// Collective over `pipeline` (rank = pipeline stage, size = shape.stages); `stage` holds this
// rank's chunks (pipeline_rank_chunks) and `batches` the step's m micro-batches (the same on
// every rank: the first stage reads the tokens, the last the targets and weights, every stage
// the lengths). Gradients add into stage.model().gradients() (not zeroed here). `links` counts
// every message and emulates its link (its world must be MPI_COMM_WORLD). `pairing`: the passes
// in paired_schedule's slots, each pair's forward and backward interleaved at their MoE exchanges
// (src/model/pass_pair.h); the same loss and gradients bit for bit (each pass's arithmetic and
// the order of the backwards, which accumulate the gradients, are the unpaired ones). Every rank
// of an EP group must pass the same `pairing`. `floor` paces the passes (not with `pairing`:
// std::invalid_argument); the loss and gradients are the same bits either way.
template <typename T>
PipelineStepStats run_pipeline_step(PipelineStage<T>& stage, const PipelineShape& shape,
                                    const std::vector<PipelineMicroBatch<T>>& batches, T aux_weight,
                                    MPI_Comm pipeline, Links& links, bool pairing = false,
                                    PassFloor floor = {});

// A forward-only pass of the same stage over the step's micro-batches: every forward of the
// schedule, no backward (forward_only_schedule), each micro-batch chunk's activations freed once
// its result is sent on, so at most one is held. The chunk that ends the model runs the stage's
// loss function (PipelineStage::set_loss) on its logits. Collective over `pipeline`, like
// run_pipeline_step; nothing is written into gradients (the stage may have none).
template <typename T>
PipelineStepStats run_pipeline_forward(PipelineStage<T>& stage, const PipelineShape& shape,
                                       const std::vector<PipelineMicroBatch<T>>& batches,
                                       MPI_Comm pipeline, Links& links);

}  // namespace rlf
