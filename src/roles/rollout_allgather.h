// Every rank's rollouts over a group of ranks that train the same samples (a TP group, a
// pipeline, a TP x PP replica), packed as DistQueue's samples (sample_packing.h) so the bytes are
// what the queue would have moved.
#pragma once

#include <cstddef>
#include <vector>

#include "mpi_comm/links.h"
#include "mpi_comm/topology.h"
#include "src/rl/rollout.h"

namespace rlf {

// Collective over group.comm: every rank's `own`, in group-rank order (canonical order when the
// ranks hold consecutive blocks). Counted on `links` (each rank's pack to every other rank).
// With `blocks`, blocks[r] receives how many of the rollouts came from rank r.
std::vector<Rollout> allgather_rollouts(const HierarchicalComm& group, Links& links,
                                        const std::vector<Rollout>& own, int group_size,
                                        std::vector<size_t>* blocks = nullptr);

}  // namespace rlf
