// The rebalancer in `train` plans on the EP group's nodes (src/app/train_rebalance.h,
// ep_cluster): with virtual nodes of 2 ranks and EP = the world, its cluster has world / 2 nodes
// of 2 EP ranks, moves between nodes are charged the emulated inter-node rate, and its decision
// after one step of known router counts is the single-process plan_rebalance on that cluster
// (at 4 ranks: the two-level placement on 2 nodes itself), the same tables on every rank. A group
// whose nodes hold unequal shares is planned as one node; a cluster file gives each level its link.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <vector>

#include "kernels/arena.h"
#include "mpi_comm/topology.h"
#include "src/app/train_rebalance.h"
#include "src/balance/incremental_rebalance.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"
#include "tests/tiny_policy.h"

namespace rlf {
namespace {

constexpr int kExperts = 12;

// Each layer's tokens per expert summed over the ranks. On 2 nodes x 2 ranks of 3 slots no
// sequence of single moves from the default placement balances these as well as the two-level
// placement does (device loads 500 400 390 400 -> 420 420 430 420 for layer 0, 240 310 460 220 ->
// 300 320 300 310 for layer 1), so the fresh placement is the decision there.
const std::vector<std::vector<int64_t>> kLayerTokens = {
    {230, 200, 70, 70, 110, 220, 100, 90, 200, 130, 150, 120},
    {200, 0, 40, 110, 140, 60, 160, 110, 190, 170, 20, 30}};

// Rank r's (token, expert) assignments of a layer: the experts e with e % ranks == r, so the
// decision needs every rank's share.
std::vector<int64_t> rank_tokens(int layer, int rank, int ranks) {
  std::vector<int64_t> tokens(kExperts, 0);
  for (int e = rank; e < kExperts; e += ranks)
    tokens[size_t(e)] = kLayerTokens[size_t(layer)][size_t(e)];
  return tokens;
}

// An EP learner over the whole world (EP = the world) on the given nodes, with the link
// emulation the rebalancer charges between them.
struct NodeLearner {
  Links links;
  HierarchicalComm world;
  ModelConfig config;
  Arena device;
  std::unique_ptr<RoleExpertParallel> ep;
  std::unique_ptr<Transformer<float>> model;
  std::unique_ptr<AdamW<float>> optimizer;

  NodeLearner(int ranks_per_node, LinkEmulation emulation, int experts)
      : links(test::virtual_node_list(test::world_size(), ranks_per_node), emulation),
        world(make_hierarchical(MPI_COMM_WORLD, links)),
        config(test::tiny_policy_config()),
        device("rebalance-nodes", 64 << 20) {
    config.n_experts = experts;
    ep = std::make_unique<RoleExpertParallel>(world, links, experts, test::world_size(),
                                              DispatchMode::Flat);
    model = std::make_unique<Transformer<float>>(config, cpu_ops(), device, true, ep->shard());
    model->initialize(5);
    ep->attach(*model);
    optimizer = std::make_unique<AdamW<float>>(*model, AdamWHyper{}, /*max_grad_norm=*/0.0f);
    optimizer->set_shard(ep->optimizer_shard(model->layout()));
  }
  ~NodeLearner() {
    optimizer.reset();
    model.reset();
    ep.reset();
    free_hierarchical(world);
  }
};

LinkEmulation slow_inter_node_link() {
  LinkEmulation emulation;
  emulation.inter_node_bandwidth = 1e8;  // 20x slower than the default counted link
  emulation.inter_node_latency = 1e-3;
  return emulation;
}

TEST(RebalanceNodes, PlansOnTheVirtualNodesAndDecidesAlikeEverywhere) {
  const int rank = test::world_rank(), size = test::world_size();
  if (size % 2 != 0) GTEST_SKIP() << "virtual nodes of 2 ranks";
  const LinkEmulation emulation = slow_inter_node_link();
  NodeLearner learner(2, emulation, kExperts);
  RoleExpertParallel& ep = *learner.ep;
  RebalanceOptions options;
  options.every = 1;
  options.horizon = 4;
  options.min_gain_ratio = 0;
  TraceRecorder no_trace;
  TrainRebalancer rebalancer(options, ep, learner.world, *learner.model, *learner.optimizer,
                             nullptr, no_trace,
                             [rank, size](int layer) { return rank_tokens(layer, rank, size); });
  const ExpertCluster expected_cluster{size / 2, 2, kExperts / size};
  EXPECT_EQ(rebalancer.cluster().nodes, expected_cluster.nodes);
  EXPECT_EQ(rebalancer.cluster().devices_per_node, 2);
  EXPECT_EQ(rebalancer.cluster().slots_per_device, kExperts / size);
  const MigrationOptions m = rebalancer.migration_options();
  // One expert's bytes over the emulated link: the transfer plus the emulated delay.
  const double inter_seconds = m.bytes_per_expert / kDefaultRebalanceLinkBandwidth +
                               emulation.delay_seconds(uint64_t(m.bytes_per_expert));
  EXPECT_DOUBLE_EQ(m.intra_node_bandwidth, kDefaultRebalanceLinkBandwidth);
  EXPECT_DOUBLE_EQ(m.inter_node_bandwidth, m.bytes_per_expert / inter_seconds);
  EXPECT_NE(rebalancer.describe().find("planned as " + std::to_string(size / 2) + " node(s)"),
            std::string::npos)
      << rebalancer.describe();

  const std::vector<std::vector<int>> before = ep.slot_experts();
  rebalancer.end_of_step(1, 1.0);
  const std::vector<std::vector<int>>& after = ep.slot_experts();
  EXPECT_EQ(rebalancer.migrations(), 1);
  for (int l = 0; l < learner.config.n_layers; ++l) {
    // The first observation is the prediction (EMA level, no trend).
    const std::vector<double> predicted(kLayerTokens[size_t(l)].begin(),
                                        kLayerTokens[size_t(l)].end());
    const Placement current{expected_cluster, kExperts, before[size_t(l)]};
    const MigrationPlan plan = plan_rebalance(current, predicted, m, kExperts);
    ASSERT_TRUE(plan.migrate) << "layer " << l;
    EXPECT_EQ(after[size_t(l)], plan.target.slot_expert) << "layer " << l;
    if (size == 4) {
      EXPECT_EQ(after[size_t(l)],
                align_to(place_two_level(predicted, expected_cluster), current).slot_expert)
          << "layer " << l;
    }
    std::vector<int> first = after[size_t(l)];
    MPI_Bcast(first.data(), int(first.size()), MPI_INT, 0, MPI_COMM_WORLD);
    EXPECT_EQ(after[size_t(l)], first) << "layer " << l;
  }
}

// Nodes of 3 ranks under an EP group of 4: the group is not whole nodes of equal shares, so
// it is planned as one node, every move charged the (slower) inter-node rate.
TEST(RebalanceNodes, UnequalNodesArePlannedAsOneNode) {
  if (test::world_size() != 4) GTEST_SKIP() << "4 ranks on nodes of 3";
  NodeLearner learner(3, slow_inter_node_link(), 8);
  RebalanceOptions options;
  options.every = 1;
  TraceRecorder no_trace;
  TrainRebalancer rebalancer(options, *learner.ep, learner.world, *learner.model,
                             *learner.optimizer, nullptr, no_trace);
  EXPECT_EQ(rebalancer.cluster().nodes, 1);
  EXPECT_EQ(rebalancer.cluster().devices_per_node, 4);
  const MigrationOptions m = rebalancer.migration_options();
  EXPECT_LT(m.inter_node_bandwidth, kDefaultRebalanceLinkBandwidth);
  EXPECT_DOUBLE_EQ(m.intra_node_bandwidth, m.inter_node_bandwidth);
}

// Measured rates time a ring inside the nodes and one across them (plus the emulated delay
// between nodes); the times vary, but every rank charges the same two rates.
TEST(RebalanceNodes, MeasuredRatesAreTheSameOnEveryRank) {
  if (test::world_size() % 2 != 0) GTEST_SKIP() << "virtual nodes of 2 ranks";
  NodeLearner learner(2, slow_inter_node_link(), kExperts);
  RebalanceOptions options;
  options.every = 1;
  options.rates = "measured";
  TraceRecorder no_trace;
  TrainRebalancer rebalancer(options, *learner.ep, learner.world, *learner.model,
                             *learner.optimizer, nullptr, no_trace);
  const MigrationOptions m = rebalancer.migration_options();
  double rates[2] = {m.intra_node_bandwidth, m.inter_node_bandwidth};
  EXPECT_GT(rates[0], 0);
  EXPECT_GT(rates[1], 0);
  // Below the emulated link alone: the measured transfer comes on top of its delay.
  EXPECT_LT(rates[1], m.bytes_per_expert /
                          slow_inter_node_link().delay_seconds(uint64_t(m.bytes_per_expert)));
  double first[2] = {rates[0], rates[1]};
  MPI_Bcast(first, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  EXPECT_EQ(rates[0], first[0]);
  EXPECT_EQ(rates[1], first[1]);
}

// A cluster file's two links: inside a node the level a node's EP ranks span, between nodes the
// level the whole EP group spans (CloudMatrix: 392 GB/s inside a supernode of 384 devices, 50 GB/s
// between supernodes).
TEST(RebalanceNodes, ACountedClusterFileGivesEachLevelItsLink) {
  RebalanceOptions options;
  options.cluster = "cloudmatrix-384";
  const RebalanceRates spanning = counted_rebalance_rates(options, 768, 384);
  EXPECT_EQ(spanning.intra_node_bandwidth, 392e9);
  EXPECT_EQ(spanning.inter_node_bandwidth, 50e9);
  const RebalanceRates inside = counted_rebalance_rates(options, 16, 8);
  EXPECT_EQ(inside.intra_node_bandwidth, 392e9);
  EXPECT_EQ(inside.inter_node_bandwidth, 392e9);
}

}  // namespace
}  // namespace rlf
