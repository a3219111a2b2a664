// The layout of roles, queue shards and nodes over the world (rules in topology.h): checked by
// arithmetic first, identically on every rank, then built with collectives.
#include "mpi_comm/topology.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "kernels/error.h"

namespace rlf {

namespace {

struct RoleCounts {
  int learners = 0, actors = 0, queue = 0;
};

std::string given_counts(const LayoutConfig& config, int world_size) {
  return "--learners " + std::to_string(config.learners) + " --actors " +
         std::to_string(config.actors) + " --queue-ranks " + std::to_string(config.queue_ranks) +
         " on a world of " + std::to_string(world_size) + " rank(s)";
}

RoleCounts single_rank_counts(const LayoutConfig& config) {
  if (config.actors != 0 || config.queue_ranks != 0 || config.learners > 1) {
    throw ConfigError(
        "a world of 1 rank is a single learner that does everything: --actors and "
        "--queue-ranks must be 0 and --learners 0 or 1, got " +
        given_counts(config, 1));
  }
  return {1, 0, 0};
}

RoleCounts resolve_role_counts(const LayoutConfig& config, int world_size) {
  if (config.learners < 0 || config.actors < 0 || config.queue_ranks < 0) {
    throw ConfigError("--learners, --actors and --queue-ranks must be >= 0, got " +
                      given_counts(config, world_size));
  }
  if (config.fused) {
    if (config.learners != 0 || config.actors != 0 || config.queue_ranks != 0) {
      throw ConfigError(
          "--mode fused makes every rank an actor and a learner: --learners, --actors and "
          "--queue-ranks must be 0, got " +
          given_counts(config, world_size));
    }
    return {world_size, 0, 0};
  }
  if (world_size == 1) return single_rank_counts(config);
  int compute_ranks = world_size - config.queue_ranks;
  RoleCounts counts{config.learners, config.actors, config.queue_ranks};
  if (counts.learners == 0 && counts.actors == 0) {
    if (compute_ranks < 2) {
      throw ConfigError(
          "the world must hold at least one learner and one actor besides the "
          "queue ranks, got " +
          given_counts(config, world_size));
    }
    counts.actors =
        std::clamp(int(std::lround(config.actor_fraction * compute_ranks)), 1, compute_ranks - 1);
    counts.learners = compute_ranks - counts.actors;
  } else if (counts.learners == 0) {
    counts.learners = compute_ranks - counts.actors;
  } else if (counts.actors == 0) {
    counts.actors = compute_ranks - counts.learners;
  }
  if (counts.learners < 1 || counts.actors < 1 ||
      counts.learners + counts.actors + counts.queue != world_size) {
    throw ConfigError(
        "learners + actors + queue ranks must equal the world size, with at least "
        "one learner and one actor (a 0 count is derived from the others), got " +
        given_counts(config, world_size));
  }
  return counts;
}

// The options that do not depend on how the role counts resolve.
void validate_options(const LayoutConfig& config, int world_size) {
  config.links.validate();
  if (!(config.actor_fraction >= 0 && config.actor_fraction <= 1)) {
    throw ConfigError("--actor-fraction must be in [0, 1], got " +
                      std::to_string(config.actor_fraction));
  }
  if (config.queue_shards < 1) {
    throw ConfigError("--queue-shards must be >= 1, got " + std::to_string(config.queue_shards));
  }
  if (config.ranks_per_node < 0 ||
      (config.ranks_per_node > 0 && world_size % config.ranks_per_node != 0)) {
    throw ConfigError("--ranks-per-node must be 0 (real nodes) or divide the world size " +
                      std::to_string(world_size) + ", got " +
                      std::to_string(config.ranks_per_node));
  }
}

std::string comma_list_or_dash(const std::vector<int>& values) {
  std::string text;
  for (int value : values) {
    if (!text.empty()) text += ',';
    text += std::to_string(value);
  }
  return text.empty() ? "-" : text;
}

}  // namespace

std::vector<int> node_list(MPI_Comm world, int ranks_per_node) {
  int world_size = 0;
  MPI_Comm_size(world, &world_size);
  if (ranks_per_node < 0 || (ranks_per_node > 0 && world_size % ranks_per_node != 0)) {
    throw ConfigError("--ranks-per-node " + std::to_string(ranks_per_node) +
                      " does not divide the " + std::to_string(world_size) + " ranks");
  }
  if (ranks_per_node > 0) {
    std::vector<int> node_of(static_cast<size_t>(world_size));
    for (int r = 0; r < world_size; ++r) node_of[size_t(r)] = r / ranks_per_node;
    return node_of;
  }
  // Real nodes, numbered in order of their lowest world rank so the numbering does not depend on
  // the order MPI lists the nodes in.
  int world_rank = 0;
  MPI_Comm_rank(world, &world_rank);
  MPI_Comm node_comm;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node_comm);
  int lowest_on_my_node = 0;
  MPI_Allreduce(&world_rank, &lowest_on_my_node, 1, MPI_INT, MPI_MIN, node_comm);
  MPI_Comm_free(&node_comm);
  std::vector<int> lowest_of(static_cast<size_t>(world_size));
  MPI_Allgather(&lowest_on_my_node, 1, MPI_INT, lowest_of.data(), 1, MPI_INT, world);
  std::map<int, int> node_of_lowest;
  for (int lowest : lowest_of) node_of_lowest.emplace(lowest, 0);
  int next = 0;
  for (auto& [lowest, node] : node_of_lowest) node = next++;
  std::vector<int> node_of(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) node_of[size_t(r)] = node_of_lowest[lowest_of[size_t(r)]];
  return node_of;
}

const char* role_name(Role role) {
  switch (role) {
    case Role::Learner:
      return "learner";
    case Role::Actor:
      return "actor";
    case Role::Queue:
      return "queue";
  }
  return "unknown";
}

Topology::Topology(MPI_Comm world, const LayoutConfig& config) : config_(config) {
  MPI_Comm_rank(world, &world_rank_);
  MPI_Comm_size(world, &world_size_);

  // Checks and role arithmetic need no communication, so every rank throws the same error or
  // none does; the first collective comes with the node list below.
  validate_options(config_, world_size_);
  RoleCounts counts = resolve_role_counts(config_, world_size_);

  for (auto [role, count] :
       {std::pair{Role::Learner, counts.learners}, std::pair{Role::Actor, counts.actors},
        std::pair{Role::Queue, counts.queue}}) {
    for (int i = 0; i < count; ++i) {
      role_ranks_[size_t(role)].push_back(int(roles_.size()));
      roles_.push_back(role);
    }
  }
  const auto& servers = counts.queue > 0 ? ranks_of(Role::Queue) : ranks_of(Role::Learner);
  for (int shard = 0; shard < config_.queue_shards; ++shard) {
    shard_server_.push_back(servers[size_t(shard) % servers.size()]);
  }

  std::vector<int> node_of = node_list(world, std::max(0, config_.ranks_per_node));
  node_count_ = *std::max_element(node_of.begin(), node_of.end()) + 1;
  links_ = std::make_unique<Links>(std::move(node_of), config_.links, world);
  if (config_.trace_routing) links_->record_routing();

  MPI_Comm role_split;
  MPI_Comm_split(world, int(role()), world_rank_, &role_split);
  role_comm_ = make_hierarchical(role_split, *links_);
  MPI_Comm_free(&role_split);
}

Topology::~Topology() {
  free_hierarchical(role_comm_);
}

std::string Topology::layout_table() const {
  std::string table = "# world-rank  node  role     role-rank  local-rank  shards-served\n";
  std::vector<int> members_so_far(size_t(node_count_), 0);
  for (int r = 0; r < world_size_; ++r) {
    int node = links_->node_of(r);
    const auto& peers = ranks_of(role_of(r));
    int rank_in_role = int(std::find(peers.begin(), peers.end(), r) - peers.begin());
    std::vector<int> shards;
    for (int s = 0; s < queue_shards(); ++s) {
      if (queue_server_of_shard(s) == r) shards.push_back(s);
    }
    char line[160];
    std::snprintf(line, sizeof line, "%12d  %4d  %-7s  %9d  %10d  %s\n", r, node,
                  config_.fused ? "fused" : role_name(role_of(r)), rank_in_role,
                  members_so_far[size_t(node)]++, comma_list_or_dash(shards).c_str());
    table += line;
  }
  return table;
}

}  // namespace rlf
