// A variable-size allgather whose bytes are counted per link class: each rank's part goes to
// every other rank of the group, so each rank counts its own part once per destination (what a
// direct exchange sends; the counters then do not depend on how MPI implements the collective).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "mpi_comm/links.h"
#include "mpi_comm/topology.h"

namespace rlf {

// Collective over group.comm. Every rank's `mine`, in group-rank order; `displacements[r]`
// receives where rank r's part starts (its end is the next part's start, or the total size).
template <typename T>
std::vector<T> allgather_counted(const HierarchicalComm& group, Links& links,
                                 const std::vector<T>& mine, MPI_Datatype type,
                                 std::vector<int>& displacements) {
  const int ranks = group.size();
  std::vector<int> counts(static_cast<size_t>(ranks));
  displacements.assign(static_cast<size_t>(ranks), 0);
  const int count = int(mine.size());
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, group.comm);
  int total = 0;
  for (int r = 0; r < ranks; ++r) {
    displacements[size_t(r)] = total;
    total += counts[size_t(r)];
  }
  std::vector<T> all(static_cast<size_t>(total));
  MPI_Allgatherv(mine.data(), count, type, all.data(), counts.data(), displacements.data(), type,
                 group.comm);
  for (int r = 0; r < ranks; ++r) {
    if (r != group.rank()) {
      links.count_send(group.world_ranks[size_t(r)], uint64_t(count) * sizeof(T));
    }
  }
  return all;
}

}  // namespace rlf
