// Topology: role counts and contiguity, queue shard servers, virtual and real nodes, the role
// communicators' node structure, the layout table, and bad layouts failing on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "mpi_comm/topology.h"
#include "tests/mpi/mpi_test_util.h"

namespace rlf {
namespace {

using test::world_rank;
using test::world_size;

std::vector<int> range(int begin, int end) {
  std::vector<int> ranks(size_t(std::max(0, end - begin)));
  std::iota(ranks.begin(), ranks.end(), begin);
  return ranks;
}

// Learners, then actors, then queue ranks, each contiguous; the role communicator holds exactly
// this rank's role.
void expect_roles(const Topology& topology, int learners, int actors, int queue) {
  ASSERT_EQ(learners + actors + queue, topology.world_size());
  EXPECT_EQ(topology.ranks_of(Role::Learner), range(0, learners));
  EXPECT_EQ(topology.ranks_of(Role::Actor), range(learners, learners + actors));
  EXPECT_EQ(topology.ranks_of(Role::Queue), range(learners + actors, topology.world_size()));
  for (int r = 0; r < topology.world_size(); ++r) {
    Role expected = r < learners            ? Role::Learner
                    : r < learners + actors ? Role::Actor
                                            : Role::Queue;
    EXPECT_EQ(topology.role_of(r), expected) << "world rank " << r;
  }
  EXPECT_EQ(topology.role_comm().world_ranks, topology.ranks_of(topology.role()));
}

TEST(Topology, DefaultSplitsTheWorldInHalfLearnersFirst) {
  Topology topology(MPI_COMM_WORLD, LayoutConfig{});
  int size = world_size();
  int actors = size == 1 ? 0 : (size + 1) / 2;  // round(0.5 * size)
  expect_roles(topology, size - actors, actors, 0);
  EXPECT_EQ(topology.world_rank(), world_rank());
}

TEST(Topology, SingleRankIsALearnerServingEveryShard) {
  if (world_size() != 1) GTEST_SKIP() << "one-rank layout";
  LayoutConfig config;
  config.queue_shards = 3;
  Topology topology(MPI_COMM_WORLD, config);
  expect_roles(topology, 1, 0, 0);
  for (int shard = 0; shard < 3; ++shard) EXPECT_EQ(topology.queue_server_of_shard(shard), 0);
}

TEST(Topology, ActorFractionRoundsAndClamps) {
  int size = world_size();
  if (size < 2) GTEST_SKIP() << "needs a learner and an actor";
  struct Case {
    double fraction;
    int actors;
  };
  // round(0.25 * size) clamped to [1, size - 1]: 1 at 2 and 4 ranks, 2 at 6 ranks (1.5 rounds up).
  for (Case c : {Case{0.25, std::clamp(int(std::lround(0.25 * size)), 1, size - 1)}, Case{0.0, 1},
                 Case{1.0, size - 1}}) {
    LayoutConfig config;
    config.actor_fraction = c.fraction;
    Topology topology(MPI_COMM_WORLD, config);
    expect_roles(topology, size - c.actors, c.actors, 0);
  }
}

TEST(Topology, ExplicitCountsAndDerivedCounts) {
  int size = world_size();
  if (size < 2) GTEST_SKIP() << "needs a learner and an actor";
  LayoutConfig explicit_counts;
  explicit_counts.learners = 1;
  explicit_counts.actors = size - 1;
  expect_roles(Topology(MPI_COMM_WORLD, explicit_counts), 1, size - 1, 0);
  LayoutConfig derived_learners;
  derived_learners.actors = 1;
  expect_roles(Topology(MPI_COMM_WORLD, derived_learners), size - 1, 1, 0);
}

TEST(Topology, ShardsServedByLearnersWithoutQueueRanks) {
  LayoutConfig config;
  config.queue_shards = 5;
  Topology topology(MPI_COMM_WORLD, config);
  const auto& learners = topology.ranks_of(Role::Learner);
  ASSERT_EQ(topology.queue_shards(), 5);
  for (int shard = 0; shard < 5; ++shard) {
    EXPECT_EQ(topology.queue_server_of_shard(shard), learners[size_t(shard) % learners.size()]);
  }
}

// 4 ranks: learner 0, actor 1, queue 2-3; 6 ranks: learners 0-1, actors 2-3, queue 4-5.
TEST(Topology, DedicatedQueueRanksComeLastAndServeShardsRoundRobin) {
  int size = world_size();
  if (size < 4) GTEST_SKIP() << "needs a learner, an actor and two queue ranks";
  LayoutConfig config;
  config.queue_ranks = 2;
  config.queue_shards = 5;
  Topology topology(MPI_COMM_WORLD, config);
  int actors = (size - 2 + 1) / 2;
  expect_roles(topology, size - 2 - actors, actors, 2);
  std::vector<int> servers;
  for (int shard = 0; shard < 5; ++shard) servers.push_back(topology.queue_server_of_shard(shard));
  EXPECT_EQ(servers, (std::vector<int>{size - 2, size - 1, size - 2, size - 1, size - 2}));
}

// The node structure of the role communicator follows from the virtual nodes: local ranks count
// within a node, leaders are one per node in node order.
void expect_role_comm_structure(const Topology& topology) {
  const HierarchicalComm& h = topology.role_comm();
  std::vector<int> nodes;
  for (int r : h.world_ranks) nodes.push_back(topology.links().node_of(r));
  ASSERT_TRUE(std::is_sorted(nodes.begin(), nodes.end())) << "role not node-contiguous";
  int intra_size = 0, my_node = topology.node();
  MPI_Comm_size(h.intra, &intra_size);
  EXPECT_EQ(intra_size, int(std::count(nodes.begin(), nodes.end(), my_node)));
  EXPECT_EQ(h.node_count(), int(std::unique(nodes.begin(), nodes.end()) - nodes.begin()));
  int me = h.rank();
  EXPECT_EQ(h.leaders != MPI_COMM_NULL, h.local_rank_of[size_t(me)] == 0);
  if (h.leaders != MPI_COMM_NULL) {
    int leader_rank = 0;
    MPI_Comm_rank(h.leaders, &leader_rank);
    EXPECT_EQ(leader_rank, h.leader_index_of[size_t(me)]);
  }
}

TEST(Topology, VirtualNodesAreConsecutiveRanks) {
  int size = world_size();
  for (int ranks_per_node : {1, 2, 3}) {
    if (size % ranks_per_node != 0) continue;
    LayoutConfig config;
    config.ranks_per_node = ranks_per_node;
    const Topology topology(MPI_COMM_WORLD, config);
    EXPECT_EQ(topology.node_count(), size / ranks_per_node);
    EXPECT_EQ(topology.node(), world_rank() / ranks_per_node);
    expect_role_comm_structure(topology);
  }
}

TEST(Topology, RealNodesOfOneMachineAreOneNode) {
  Topology topology(MPI_COMM_WORLD, LayoutConfig{});
  EXPECT_EQ(topology.node_count(), 1);
  EXPECT_EQ(topology.node(), 0);
  expect_role_comm_structure(topology);
}

// Parses every row back and compares it with the accessors.
TEST(Topology, LayoutTableHasOneRowPerRank) {
  LayoutConfig config;
  config.queue_shards = 3;
  config.ranks_per_node = world_size() % 2 == 0 ? 2 : 1;
  Topology topology(MPI_COMM_WORLD, config);
  std::istringstream table(topology.layout_table());
  std::string line;
  int rows = 0;
  std::vector<int> seen_on_node(size_t(topology.node_count()), 0);
  while (std::getline(table, line)) {
    if (line.starts_with("#")) continue;
    std::istringstream row(line);
    int rank = -1, node = -1, rank_in_role = -1, local_rank = -1;
    std::string role, shards;
    row >> rank >> node >> role >> rank_in_role >> local_rank >> shards;
    ASSERT_EQ(rank, rows) << line;
    EXPECT_EQ(node, topology.links().node_of(rank));
    EXPECT_EQ(role, role_name(topology.role_of(rank)));
    EXPECT_EQ(topology.ranks_of(topology.role_of(rank))[size_t(rank_in_role)], rank);
    EXPECT_EQ(local_rank, seen_on_node[size_t(node)]++);
    std::string expected_shards;
    for (int s = 0; s < 3; ++s) {
      if (topology.queue_server_of_shard(s) != rank) continue;
      if (!expected_shards.empty()) expected_shards += ',';
      expected_shards += std::to_string(s);
    }
    EXPECT_EQ(shards, expected_shards.empty() ? std::string("-") : expected_shards);
    ++rows;
  }
  EXPECT_EQ(rows, world_size());
}

TEST(Topology, BadLayoutsFailOnEveryRankNamingTheOption) {
  int size = world_size();
  auto expect_bad = [](LayoutConfig config, const std::string& option) {
    test::expect_config_error_everywhere([&] { Topology topology(MPI_COMM_WORLD, config); },
                                         option);
  };
  LayoutConfig too_many;
  too_many.learners = size;
  too_many.actors = 1;
  expect_bad(too_many, "--learners");
  LayoutConfig too_few;
  too_few.learners = 1;
  too_few.actors = 1;
  too_few.queue_ranks = size;  // leaves no room whatever the size
  expect_bad(too_few, "--queue-ranks");
  LayoutConfig negative;
  negative.actors = -1;
  expect_bad(negative, "--actors");
  LayoutConfig no_shard;
  no_shard.queue_shards = 0;
  expect_bad(no_shard, "--queue-shards");
  LayoutConfig uneven_nodes;
  uneven_nodes.ranks_per_node = size + 1;
  expect_bad(uneven_nodes, "--ranks-per-node");
  LayoutConfig fraction;
  fraction.actor_fraction = 1.5;
  expect_bad(fraction, "--actor-fraction");
  LayoutConfig bandwidth;
  bandwidth.links.inter_node_bandwidth = -1;
  expect_bad(bandwidth, "--inter-node-bandwidth");
  LayoutConfig latency;
  latency.links.inter_node_latency = 11;
  expect_bad(latency, "--inter-node-latency");
}

TEST(Topology, SingleRankCannotHoldAnActor) {
  if (world_size() != 1) GTEST_SKIP() << "one-rank layout";
  LayoutConfig config;
  config.actors = 1;
  test::expect_config_error_everywhere([&] { Topology topology(MPI_COMM_WORLD, config); },
                                       "--actors");
}

}  // namespace
}  // namespace rlf
