// Two resumable passes (src/model/resumable_pass.h) run as a pair on one core, the Adaptive Pipe
// / DualPipe idea inside a pipeline schedule: while one pass's expert-parallel dispatch or combine
// is in flight, the other computes, and every progress point of the computing pass drives the
// waiting one's exchange. Neither pass's arithmetic changes: each runs its own steps in its own
// order; only when they run is decided here.
#pragma once

#include <functional>

#include "src/model/resumable_pass.h"

namespace rlf {

// Where a pair's wall time went: each pass's own running (its compute and the CPU work of its
// exchanges, and the other's progress calls made at its progress points), and the time both were
// stopped, waiting for an exchange (PairOrder::ByCompletion: split evenly between the passes that
// waited; Alternating: the pass whose turn it was).
struct PairTime {
  double first = 0, second = 0;
};

// How the driver picks the pass that runs on after both have started.
enum class PairOrder {
  // Whichever has its exchange completed (the first on a tie): the interleaving follows the
  // messages. Every rank that exchanges with these passes' dispatchers must run the matching
  // passes too, in a pair or not (their exchanges match by dispatcher, not by order between
  // dispatchers).
  ByCompletion,
  // Strictly in turn, first, second, first, ..., switching at every exchange (also one already
  // complete: PassState::stop_at_every_exchange), each waiting out its exchange (while driving
  // the other's) when it is not yet complete: the same interleaving on every rank. Passes that hold
  // blocking collectives of their own (a TP group's allreduces and allgathers) need it, so that
  // every rank of that group enters them in one order; the ranks exchanging with these passes
  // must run them as a pair in the same order too.
  Alternating,
};

// Runs both passes to their ends: `first` starts (up to its first exchange), then `second`;
// after that `order` decides. Deterministic in what each pass computes either way. `ended(0)` /
// `ended(1)` (if given) runs as soon as the first / second pass has ended, while the other may
// still run: a pipeline sends that pass's result on at once.
PairTime run_as_pair(ResumablePass& first, ResumablePass& second,
                     const std::function<void(int pass)>& ended = {},
                     PairOrder order = PairOrder::ByCompletion);

}  // namespace rlf
