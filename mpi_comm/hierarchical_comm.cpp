// The node structure of a communicator: node communicators, node leaders, and each rank's place
// in them, computed identically on every rank from the world ranks and the node list.
#include <algorithm>
#include <map>
#include <utility>

#include "mpi_comm/topology.h"

namespace rlf {

int HierarchicalComm::rank() const {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

int HierarchicalComm::node_count() const {
  int count = 0;
  for (int index : leader_index_of) count = std::max(count, index + 1);
  return count;
}

HierarchicalComm make_hierarchical(MPI_Comm comm, const Links& links) {
  HierarchicalComm h;
  MPI_Comm_dup(comm, &h.comm);
  int rank = 0, size = 0;
  MPI_Comm_rank(h.comm, &rank);
  MPI_Comm_size(h.comm, &size);
  int my_world_rank = links.world_rank();
  h.world_ranks.resize(size_t(size));
  MPI_Allgather(&my_world_rank, 1, MPI_INT, h.world_ranks.data(), 1, MPI_INT, h.comm);

  // Keys are comm ranks, so local ranks and leader order follow comm order, which is what the
  // arithmetic below assumes.
  MPI_Comm_split(h.comm, links.node_of(my_world_rank), rank, &h.intra);
  int local_rank = 0;
  MPI_Comm_rank(h.intra, &local_rank);
  MPI_Comm_split(h.comm, local_rank == 0 ? 0 : MPI_UNDEFINED, rank, &h.leaders);

  std::map<int, std::pair<int, int>> leader_index_and_members_of_node;
  h.local_rank_of.resize(size_t(size));
  h.leader_index_of.resize(size_t(size));
  for (int r = 0; r < size; ++r) {
    int node = links.node_of(h.world_ranks[size_t(r)]);
    int next_leader_index = int(leader_index_and_members_of_node.size());
    auto& [leader_index, members] =
        leader_index_and_members_of_node.try_emplace(node, next_leader_index, 0).first->second;
    h.leader_index_of[size_t(r)] = leader_index;
    h.local_rank_of[size_t(r)] = members++;
  }
  // Equal nodes (the same on every rank: computed from the same world ranks and node list).
  bool equal_nodes = true;
  for (const auto& [node, index_and_members] : leader_index_and_members_of_node)
    equal_nodes = equal_nodes && index_and_members.second == size / h.node_count();
  if (equal_nodes) MPI_Comm_split(h.comm, local_rank, rank, &h.peers);
  return h;
}

void free_hierarchical(HierarchicalComm& h) {
  for (MPI_Comm* c : {&h.peers, &h.leaders, &h.intra, &h.comm}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
  h = HierarchicalComm{};
}

ConsecutiveGroups split_consecutive_groups(MPI_Comm comm, int group_size, const Links& links) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  ConsecutiveGroups split;
  split.group = rank / group_size;
  split.groups = size / group_size;
  split.place = rank % group_size;
  MPI_Comm members = MPI_COMM_NULL, across = MPI_COMM_NULL;
  MPI_Comm_split(comm, split.group, split.place, &members);
  MPI_Comm_split(comm, split.place, split.group, &across);
  split.members = make_hierarchical(members, links);
  split.across = make_hierarchical(across, links);
  MPI_Comm_free(&members);
  MPI_Comm_free(&across);
  return split;
}

void free_consecutive_groups(ConsecutiveGroups& groups) {
  free_hierarchical(groups.across);
  free_hierarchical(groups.members);
}

}  // namespace rlf
