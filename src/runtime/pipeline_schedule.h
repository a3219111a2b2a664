// Pipeline-parallel schedules as pure functions: the order of forward and backward passes on
// every stage for p stages (ranks), m micro-batches and v virtual stages (model chunks) per rank
// -- 1F1B for v = 1 and Megatron-LM's interleaved 1F1B for v > 1 -- and their timing under given
// pass costs (the counted bubble). No MPI: the executor (src/runtime/pipeline_step.h) runs them.
//
// Virtual stages: the model is cut into p * v chunks of consecutive layers, in layer order;
// chunk k of rank r is virtual stage k * p + r, so activations go rank 0, 1, ..., p - 1, then
// back to rank 0 for its next chunk. With v = 1 a rank holds one contiguous range of layers.
#pragma once

#include <string>
#include <vector>

namespace rlf {

struct PipelineShape {
  int stages = 1;          // p: ranks in the pipeline
  int micro_batches = 1;   // m
  int virtual_stages = 1;  // v: model chunks per rank (1: plain 1F1B)
  int chunks() const { return stages * virtual_stages; }
  bool interleaved() const { return virtual_stages > 1; }
};

// "1F1B" or "interleaved 1F1B".
std::string schedule_name(const PipelineShape& shape);

// Arithmetic on the shape, the model's layer count and the world size only, so every rank throws
// the same ConfigError before any work: p, m, v >= 1; p divides the world size; p * v divides the
// layers (every chunk the same number of layers; with `balanced` layers, only p * v <= layers);
// with v > 1, m a multiple of p (the interleaved schedule runs micro-batches in groups of p).
void validate_pipeline(const PipelineShape& shape, int n_layers, int world_size,
                       bool balanced = false);
// ConfigError unless `boundaries` cut the model's layers into the shape's p v chunks of
// consecutive layers: p v + 1 indices from 0 to `n_layers`, every chunk at least one layer (the
// message names --pipeline-balance and gives the layers per chunk).
void validate_chunk_boundaries(const std::vector<int>& boundaries, const PipelineShape& shape,
                               int n_layers);

enum class PassKind { Forward, Backward };

struct PipelineOp {
  PassKind kind = PassKind::Forward;
  int micro_batch = 0;
  int chunk = 0;  // the rank's local chunk, 0 .. v - 1
  bool operator==(const PipelineOp&) const = default;
};

// Virtual stage of local chunk `chunk` on `rank`, and back.
inline int virtual_stage(const PipelineShape& s, int rank, int chunk) {
  return chunk * s.stages + rank;
}
inline int rank_of_virtual_stage(const PipelineShape& s, int stage) {
  return stage % s.stages;
}
inline int chunk_of_virtual_stage(const PipelineShape& s, int stage) {
  return stage / s.stages;
}

// The passes of `rank` in execution order (2 m v of them): a warm-up of forwards, then one
// forward and one backward alternately, then the remaining backwards. 1F1B warms up with
// min(p - r - 1, m) forwards; interleaved with min(2 (p - r - 1) + (v - 1) p, m v), its
// forwards going through the chunks in groups of p micro-batches (chunk 0 of micro-batches
// 0..p-1, chunk 1 of the same, ..., then the next group) and its backwards the same way with the
// chunks in reverse.
std::vector<PipelineOp> pipeline_schedule(const PipelineShape& shape, int rank);

// Adaptive-Pipe / DualPipe pairing: pipeline_schedule(shape, rank) in slots, each one pass or a
// forward and a backward run together as a pair (their MoE exchanges interleaved, one computing
// while the other's dispatch or combine is in flight: src/model/pass_pair.h). A forward directly
// followed in the list by a backward of another micro-batch makes a pair (in the 1F1B steady
// state, and the interleaved one's); a backward of the forward's own micro-batch needs that
// forward's result (the last stage's loss, or its activations coming back) and stays alone. A
// pair starts once both passes' inputs are there; every rank's slots together do not deadlock
// even when a pair sends both results only when it ends (simulate_paired_schedule checks it; the
// executor sends each result as soon as its pass ends, which only comes earlier). A pure function of
// the shape and the rank, so the ranks of one stage in different pipelines (an EP group) pair the
// same passes in the same order.
using PipelineSlot = std::vector<PipelineOp>;  // one pass, or a forward then a backward
std::vector<PipelineSlot> paired_schedule(const PipelineShape& shape, int rank);

// The forwards of pipeline_schedule(shape, rank) in its order, no backward (m v passes): a
// forward-only pass over the stages (the KL reference's log-probs). A subsequence of a schedule
// that does not deadlock does not either: every forward waits only for forwards.
std::vector<PipelineOp> forward_only_schedule(const PipelineShape& shape, int rank);

// The most chunk activations `rank` holds at once (forwards done whose backward is not): the
// warm-up plus one. 1F1B: min(p - r, m) micro-batches; interleaved: min(2 (p - r - 1) + (v - 1) p
// + 1, m v) chunks of 1/v of the rank's layers each.
int in_flight_bound(const PipelineShape& shape, int rank);
// Counted on a schedule: the largest number of forwards done and not yet backwarded.
int in_flight_peak(const std::vector<PipelineOp>& ops);

// The bubble fraction of the schedule under equal costs: (p - 1) / (m v + p - 1).
double bubble_formula(const PipelineShape& shape);

// Start and end of every pass when each rank runs its passes in order, each as soon as its
// rank is free and its input is there (the forward of the previous virtual stage, the backward
// of the next one, or for the last virtual stage its own forward), messages taking no time.
struct ScheduleTiming {
  double makespan = 0;
  std::vector<double> busy;                     // per rank
  std::vector<std::vector<double>> start, end;  // per rank, per pass in its order
  double idle(int rank) const { return makespan - busy[size_t(rank)]; }
  double bubble_fraction(int rank) const { return makespan > 0 ? idle(rank) / makespan : 0; }
};

// `forward_cost[s]` / `backward_cost[s]`: one pass of virtual stage s (p v entries each).
// Throws std::logic_error when the schedules deadlock (a pass waits for one that its rank runs
// later, or for one no rank runs).
ScheduleTiming simulate_schedule(const PipelineShape& shape,
                                 const std::vector<std::vector<PipelineOp>>& schedules,
                                 const std::vector<double>& forward_cost,
                                 const std::vector<double>& backward_cost);
// The same with every rank's passes in slots (paired_schedule): a slot starts when its rank is
// free and every input of its passes is there, runs its passes back to back (their costs add up:
// pairing hides communication, not compute) and ends them together. start and end: per pass in
// the rank's order, each pass its slot's.
ScheduleTiming simulate_paired_schedule(const PipelineShape& shape,
                                        const std::vector<std::vector<PipelineSlot>>& schedules,
                                        const std::vector<double>& forward_cost,
                                        const std::vector<double>& backward_cost);
// Every rank's pipeline_schedule with every pass one slot: idle slots / makespan is the
// schedule's counted bubble.
ScheduleTiming simulate_unit_schedule(const PipelineShape& shape);

}  // namespace rlf
