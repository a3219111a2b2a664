#include "src/runtime/weight_sync.h"

#include "mpi_comm/hierarchical_collectives.h"

namespace rlf {

WeightSync::WeightSync(MPI_Comm world, Topology& topology) : topology_(topology) {
  const bool takes_part = topology.world_rank() == topology.ranks_of(Role::Learner).front() ||
                          topology.role() == Role::Actor;
  MPI_Comm comm = MPI_COMM_NULL;
  // Key = world rank: learner 0 (the lowest world rank) becomes rank 0, the root.
  MPI_Comm_split(world, takes_part ? 0 : MPI_UNDEFINED, topology.world_rank(), &comm);
  if (comm != MPI_COMM_NULL) {
    group_ = make_hierarchical(comm, topology.links());
    MPI_Comm_free(&comm);  // make_hierarchical keeps its own duplicate
  }
}

WeightSync::~WeightSync() {
  if (member()) free_hierarchical(group_);
}

uint64_t WeightSync::broadcast(float* params, int64_t count) {
  if (!member()) return 0;
  const uint64_t bytes = uint64_t(count) * sizeof(float);
  rlf::broadcast(params, bytes, /*root=*/0, group_, topology_.links());
  return bytes;
}

}  // namespace rlf
