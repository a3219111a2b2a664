// `bench calibrate`'s measurement of an expert-parallel exchange's cost beyond its link time.
//
// The ping-pong gives a link's latency and bandwidth, but an EP dispatch or combine is more than
// its messages: the dispatcher counts and sorts the routing, exchanges counts and metadata, packs
// rows into send buffers and unpacks them in canonical order, and drives the split-phase chain.
// On small batches (decode steps, a tiny model's micro-batches) that software cost is most of an
// exchange, and the link model alone predicted EP steps at half their measured time. So the
// runtime's own ExpertDispatcher is timed on 2 ranks at two batch sizes, and what the link model
// does not explain is split into a fixed cost per operation and a cost per routed row.
//
// Those operations run back to back, the ranks already in step. In a run each operation follows
// work of the rank's own (a layer's attention, its experts), and equal work does not finish at
// the same moment on two cores; the early rank then waits and must notice the late one's
// messages. That lock-step cost is measured apart: the same operations each after an equal
// matrix product on both ranks, less the product alone and the operations alone. A product
// finishes at nearly the same moment on both cores; a layer's forward, which also streams
// activations through memory, does not (measured here: the lock-step cost grows with the work
// before each operation, from under 1 us after a 20 us product to 9-30 us after 65-200 us of
// memory sweeps), so the lock-step is measured again after the runtime's own forward of a
// reference model and the excess kept as a fraction of that work: the spread of equal work's
// finishing times, which the cost model charges on the work between a run's EP operations.
#pragma once

#include <algorithm>
#include <functional>

#include "src/sim/cluster.h"

namespace rlf {

// An operation's cost beyond its link time: a fixed part and a part per (token, slot) assignment
// it handles, fitted to the two batches' measured seconds per operation.
struct ExchangeFit {
  double overhead = 0, row_seconds = 0;
  double small_seconds = 0, large_seconds = 0;
};

// One lock-step measurement: the medians of its three loops (the work alone, an operation alone,
// the work then an operation).
struct LockStep {
  double work_seconds = 0, exchange_seconds = 0, period = 0;
  // Seconds per operation beyond the work and the operation alone (never below 0).
  double beyond() const { return std::max(0.0, period - work_seconds - exchange_seconds); }
};

struct ExpertExchangeCost {
  // Dispatch and combine (the forward operations, the only ones generation runs: routing counts
  // and metadata go out before the rows) apart from their backward (combine_backward,
  // dispatch_backward: the forward's routing plan reused).
  ExchangeFit forward, backward;
  int small_tokens = 0, large_tokens = 0;
  // Seconds per operation when every operation follows an equal matrix product on both ranks,
  // beyond the product and the operation alone (`fixed.beyond()`).
  double lockstep = 0;
  LockStep fixed;
  // The same with a layer's work before each operation (the runtime's forward of a model, which
  // reads and writes activations besides its products): what that adds beyond `lockstep`, as a
  // fraction of the work (`layer.beyond() - lockstep) / layer.work_seconds`, never below 0).
  double spread = 0;
  LockStep layer;
};

// Collective over MPI_COMM_WORLD, which must have 2 ranks: ExpertDispatcher (flat, 4 experts,
// top-2, rows of 32 floats) over the runtime's Links without emulation, the four operations of a
// trained MoE layer in a row; per operation of each pair (forward, backward), the slowest rank's
// median over 10 x `repeats` runs.
// Then the lock-step cost at the small batch: 10 x `repeats` rounds of three loops of 20
// iterations, the equal product alone, an operation alone (dispatch and combine alternating) and
// the product then an operation, each iteration timed on its own; per loop the median iteration;
// and 4 x `repeats` rounds of the same loops with `layer_work` (the same on both ranks) instead of
// the product.
// `link`: the measured intra-node link the cost model charges the messages on.
ExpertExchangeCost measure_expert_exchange(const sim::Link& link, int repeats,
                                           const std::function<void()>& layer_work);

}  // namespace rlf
