// The SPMD layout: which world ranks are actors, learners and queue servers; which node (real
// or virtual) each rank is on; the role communicators, node communicators and the data-parallel
// groups built from them. Every rank computes the same layout from the same configuration, so a
// layout that does not fit the world size fails on every rank with the same message.
//
// Layout rules (W = world size, Q = --queue-ranks):
// - World ranks go to learners first, then actors, then dedicated queue ranks, so each role's
//   ranks are contiguous (and, with virtual nodes, node-contiguous).
// - Role counts: with --learners and --actors both 0, actors = round(actor_fraction * (W - Q))
//   clamped to [1, W - Q - 1] and learners take the rest; with one of them 0, it takes what the
//   other and Q leave; with both given, learners + actors + Q must equal W. Learners and actors
//   must each end up >= 1.
// - Fused (config.fused): every rank is a learner that also generates; the counts must be 0.
// - A world of 1 rank is a single learner (actors == 0, no queue rank): single-rank runs take
//   the one-rank path, where that rank does everything.
// - Queue shards (>= 1): shard s is served by queue rank s % Q when Q > 0, else by learner
//   s % learners (a service loop inside compute ranks).
// - Nodes: --ranks-per-node R > 0 makes virtual nodes, node = world rank / R, and R must divide
//   W; R == 0 uses the real nodes (MPI_COMM_TYPE_SHARED), numbered in order of their lowest
//   world rank (with real nodes, a role is node-contiguous only if the launcher places ranks
//   by node).
// - Every check is arithmetic on the configuration and W and runs before the first collective,
//   so a bad layout throws the same ConfigError on every rank instead of hanging.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "mpi_comm/links.h"

namespace rlf {

enum class Role { Learner = 0, Actor = 1, Queue = 2 };
const char* role_name(Role role);

struct LayoutConfig {
  int learners = 0;             // 0: derived (the world minus actors and queue ranks)
  int actors = 0;               // 0: derived from actor_fraction
  double actor_fraction = 0.5;  // used when actors == 0 and learners == 0
  int queue_ranks = 0;     // dedicated queue servers; 0: queue shards served inside learner ranks
  int queue_shards = 2;    // shards of the DistQueue (at least 1)
  int ranks_per_node = 0;  // virtual nodes of this many consecutive ranks; 0: real nodes
  // RL Fusion: every rank is both actor and learner. All ranks are learners in the role
  // arithmetic (no actor or dedicated queue rank; learners, actors and queue_ranks must be 0).
  bool fused = false;
  LinkEmulation links;
  // The expert dispatchers on this topology's links log their inputs (Links::record_routing).
  bool trace_routing = false;
};

// Communicator with its node structure: the ranks of `comm` on this rank's node (`intra`, in
// comm order), and one leader per node (local rank 0) in `leaders` (MPI_COMM_NULL on
// non-leaders; leaders in comm order of their leader). `comm` is a duplicate of the communicator
// it was made from, so collectives on it never match the caller's own messages; the struct
// owns all three communicators (free_hierarchical).
struct HierarchicalComm {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm intra = MPI_COMM_NULL;
  MPI_Comm leaders = MPI_COMM_NULL;
  // The ranks of the same local rank on every node (one per node), when every node holds the
  // same number of ranks; MPI_COMM_NULL otherwise. The inter-node step of allreduce_sum runs over
  // it, each local rank for its own share of the data.
  MPI_Comm peers = MPI_COMM_NULL;
  std::vector<int> world_ranks;  // world rank of every rank of `comm`, in comm order
  // For every rank of `comm`: its rank in `intra`, and the `leaders` rank of its node's leader.
  std::vector<int> local_rank_of;
  std::vector<int> leader_index_of;
  int rank() const;  // this rank in `comm`
  int size() const { return int(world_ranks.size()); }
  int node_count() const;  // size of `leaders`
};

class Topology {
 public:
  // Collective over `world`. Throws ConfigError (same text on every rank) when the layout does
  // not fit world size (role counts that exceed or do not add up to it, no queue shard, virtual
  // nodes that do not divide it, ...).
  Topology(MPI_Comm world, const LayoutConfig& config);
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  Role role() const { return roles_[size_t(world_rank_)]; }
  Role role_of(int world_rank) const { return roles_[size_t(world_rank)]; }
  int node() const { return links_->node_of(world_rank_); }
  int node_count() const { return node_count_; }
  // World ranks of a role, ascending.
  const std::vector<int>& ranks_of(Role role) const { return role_ranks_[size_t(role)]; }
  // This rank's role communicator (actors, learners or queue servers), with node structure.
  const HierarchicalComm& role_comm() const { return role_comm_; }
  // World ranks serving queue shard s (a dedicated queue rank, or a learner hosting it).
  int queue_server_of_shard(int shard) const { return shard_server_[size_t(shard)]; }
  int queue_shards() const { return int(shard_server_.size()); }
  Links& links() { return *links_; }
  const Links& links() const { return *links_; }
  const LayoutConfig& config() const { return config_; }

  // Fixed-width table, one line per world rank under a '#' header: world rank, node, role, rank
  // in role, local rank on the node, queue shards served (printed by rank 0).
  std::string layout_table() const;

 private:
  LayoutConfig config_;
  int world_rank_ = 0, world_size_ = 0, node_count_ = 0;
  std::vector<Role> roles_;
  std::vector<std::vector<int>> role_ranks_{3};
  std::vector<int> shard_server_;
  HierarchicalComm role_comm_;
  std::unique_ptr<Links> links_;
};

// Builds the node structure of any communicator whose ranks' nodes `links` knows (collective
// over `comm`).
// The node of every rank of `world` (collective): virtual nodes of `ranks_per_node` consecutive
// ranks, or with 0 the real (shared-memory) nodes numbered in order of their lowest rank. A
// negative count or one that does not divide the ranks: ConfigError, the same on every rank.
std::vector<int> node_list(MPI_Comm world, int ranks_per_node);

HierarchicalComm make_hierarchical(MPI_Comm comm, const Links& links);
// Frees the communicators of `h` (collective over h.comm) and leaves it empty.
void free_hierarchical(HierarchicalComm& h);

// `comm` cut into groups of `group_size` consecutive ranks (rank r: group r / group_size, place
// r % group_size in it) and the communicators across them (the ranks with the same place, one per
// group, in group order): how a model-parallel group (a TP group, a pipeline) and its
// data-parallel replicas are laid out. Owns its communicators (free_consecutive_groups).
struct ConsecutiveGroups {
  int group = 0, groups = 1;  // this rank's group and their count
  int place = 0;              // this rank's place in its group
  HierarchicalComm members;   // this rank's group (rank = place)
  HierarchicalComm across;    // the ranks with this rank's place (rank = group)
};
// Collective over `comm`; group_size must divide its size (checked by the caller's validation).
ConsecutiveGroups split_consecutive_groups(MPI_Comm comm, int group_size, const Links& links);
// Frees both communicators (collective over `comm` of the split).
void free_consecutive_groups(ConsecutiveGroups& groups);

}  // namespace rlf
