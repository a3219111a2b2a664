// Disaggregated weight sync: after each optimizer step, learner rank 0 (world rank 0) sends the
// new parameters to every actor by a bucketed hierarchical broadcast (to the node leaders across
// nodes, then inside each node), counted per link class. Actors in TP groups (T consecutive
// actors, a TP rank each) can receive only their TP slice: one broadcast per TP rank, to the
// actors of that rank.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "mpi_comm/topology.h"

namespace rlf {

class WeightSync {
 public:
  // Collective over `world` (the communicator `topology` was built on). `actor_slices` T > 1:
  // also a group per actor TP rank r (learner 0 and the actors whose index among the actors is r
  // modulo T, the TensorParallel ranks of consecutive actor TP groups) for broadcast_slice.
  WeightSync(MPI_Comm world, Topology& topology, int actor_slices = 1);
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
  // The groups of broadcast_slice (1: none).
  int actor_slices() const { return std::max(1, int(slice_groups_.size())); }
  // Actors of TP rank `slice`: receive that slice of the model (params[count]); every other rank
  // but the root returns at once. Returns the bytes received.
  uint64_t broadcast_slice(int slice, float* params, int64_t count);
  // Root: sends slices[r] to the actors of TP rank r, for every r in order (a broadcast each, which
  // the actors meet in broadcast_slice). Returns the bytes sent (0 off the root).
  uint64_t send_slices(std::vector<std::vector<float>>& slices);

 private:
  Topology& topology_;
  HierarchicalComm group_;
  std::vector<HierarchicalComm> slice_groups_;  // [TP rank]; MPI_COMM_NULL where not a member
};

}  // namespace rlf
