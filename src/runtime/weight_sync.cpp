#include "src/runtime/weight_sync.h"

#include <algorithm>
#include <vector>

#include "mpi_comm/hierarchical_collectives.h"

namespace rlf {

namespace {

// The ranks with `takes_part` over `world`, learner 0 (the lowest world rank, key = world rank)
// their rank 0; MPI_COMM_NULL elsewhere. Collective over `world`.
HierarchicalComm split_members(MPI_Comm world, const Topology& topology, bool takes_part) {
  HierarchicalComm group;
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_split(world, takes_part ? 0 : MPI_UNDEFINED, topology.world_rank(), &comm);
  if (comm != MPI_COMM_NULL) {
    group = make_hierarchical(comm, topology.links());
    MPI_Comm_free(&comm);  // make_hierarchical keeps its own duplicate
  }
  return group;
}

}  // namespace

WeightSync::WeightSync(MPI_Comm world, Topology& topology, int actor_slices) : topology_(topology) {
  const bool root = topology.world_rank() == topology.ranks_of(Role::Learner).front();
  const bool actor = topology.role() == Role::Actor;
  group_ = split_members(world, topology, root || actor);
  if (actor_slices <= 1) return;
  const std::vector<int>& actors = topology.ranks_of(Role::Actor);
  const auto at = std::find(actors.begin(), actors.end(), topology.world_rank());
  const int actor_index = at == actors.end() ? -1 : int(at - actors.begin());
  for (int slice = 0; slice < actor_slices; ++slice) {
    slice_groups_.push_back(
        split_members(world, topology, root || (actor && actor_index % actor_slices == slice)));
  }
}

WeightSync::~WeightSync() {
  if (member()) free_hierarchical(group_);
  for (HierarchicalComm& group : slice_groups_) {
    if (group.comm != MPI_COMM_NULL) free_hierarchical(group);
  }
}

uint64_t WeightSync::send_slices(std::vector<std::vector<float>>& slices) {
  if (!member() || group_.rank() != 0) return 0;
  uint64_t bytes = 0;
  for (size_t r = 0; r < slices.size(); ++r)
    bytes += broadcast_slice(int(r), slices[r].data(), int64_t(slices[r].size()));
  return bytes;
}

uint64_t WeightSync::broadcast_slice(int slice, float* params, int64_t count) {
  HierarchicalComm& group = slice_groups_.at(size_t(slice));
  if (group.comm == MPI_COMM_NULL) return 0;
  const uint64_t bytes = uint64_t(count) * sizeof(float);
  const TrafficScope traffic(topology_.links(), TrafficKind::WeightSync);
  rlf::broadcast(params, bytes, /*root=*/0, group, topology_.links());
  return bytes;
}

uint64_t WeightSync::broadcast(float* params, int64_t count) {
  if (!member()) return 0;
  const uint64_t bytes = uint64_t(count) * sizeof(float);
  const TrafficScope traffic(topology_.links(), TrafficKind::WeightSync);
  rlf::broadcast(params, bytes, /*root=*/0, group_, topology_.links());
  return bytes;
}

}  // namespace rlf
