// Disaggregated weight sync: after each optimizer step, learner rank 0 (world rank 0) sends the
// new parameters to every actor by a bucketed hierarchical broadcast (to the node leaders across
// nodes, then inside each node), counted per link class.
#pragma once

#include <cstdint>

#include "mpi_comm/topology.h"

namespace rlf {

class WeightSync {
 public:
  // Collective over `world` (the communicator `topology` was built on).
  WeightSync(MPI_Comm world, Topology& topology);
  ~WeightSync();
  WeightSync(const WeightSync&) = delete;
  WeightSync& operator=(const WeightSync&) = delete;

  // Learner 0 and the actors take part; every other rank returns at once.
  bool member() const { return group_.comm != MPI_COMM_NULL; }
  // Learner 0 (rank 0, the root) and the actors, world-rank order; MPI_COMM_NULL elsewhere.
  MPI_Comm comm() const { return group_.comm; }
  // Root (learner 0) sends params[count]; actors receive into it. Returns the bytes this rank
  // sent or received.
  uint64_t broadcast(float* params, int64_t count);

 private:
  Topology& topology_;
  HierarchicalComm group_;
};

}  // namespace rlf
