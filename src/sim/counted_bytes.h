// The bytes a finished `rlfusion train` run's link counters hold (mpi_comm/links.h), predicted from
// its layout and its token totals by the same rules the runtime follows: the bucketed hierarchical
// weight broadcast, DistQueue's messages (hierarchical_collectives.h, queue_protocol.h,
// sample_packing.h) and the hierarchical gradient all-reduce. Exact for the layouts
// `exact` says; expert-parallel dispatch depends on the routing and is not counted here.
#pragma once

#include <cstdint>

#include "src/sim/strategy.h"

namespace rlf::sim {

struct RuntimeRun {
  Mode mode = Mode::Fused;
  int ranks = 1;
  int ranks_per_node = 1;
  int actors = 0;  // disaggregated: actors after the learners; learners = ranks - actors
  int queue_shards = 2;
  int expert_parallel = 1;  // fused: the training EP degree
  int staleness = 0;
  int64_t steps = 0;
  int64_t samples_per_step = 0;
  int64_t parameters = 0;         // the whole model's
  int64_t routed_parameters = 0;  // of which routed experts
  int64_t trained_tokens = 0;     // prompt + response tokens over every RL step
  int64_t response_tokens = 0;    // response tokens over every RL step
};

struct CountedBytes {
  uint64_t intra = 0, inter = 0;
  bool exact = false;  // false: a layout these rules do not cover exactly (see the .cpp)
};

CountedBytes counted_bytes(const RuntimeRun& run);

}  // namespace rlf::sim
