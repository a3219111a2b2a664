// The trace's router statistics as the report sums them: per layer over ranks and steps, and one
// layer's per-step table for `bench balance --routing-trace`.
#include <gtest/gtest.h>

#include <vector>

#include "src/io/router_summary.h"

namespace rlf {
namespace {

// Two ranks, layers 0 and 2, experts 0..3: rank 0 records steps 1-3, rank 1 steps 1 and 3 (a rank
// whose tokens never reached an expert records nothing for it).
TraceData two_rank_trace() {
  TraceData trace;
  trace.router_loads.resize(2);
  auto add = [&](int rank, int step, int layer, int expert, int64_t tokens) {
    trace.router_loads[size_t(rank)].push_back(RouterLoad{step, layer, expert, tokens});
  };
  for (int step = 1; step <= 3; ++step) {
    add(0, step, 0, 0, 10 * step);
    add(0, step, 0, 3, 1);
    add(0, step, 2, 1, 5);
  }
  add(1, 1, 0, 0, 7);
  add(1, 3, 0, 2, 4);
  add(1, 3, 2, 1, 6);
  return trace;
}

TEST(RouterSummary, LayerRoutingSumsRanksPerStepWithAColumnPerExpert) {
  const TraceData trace = two_rank_trace();
  EXPECT_EQ(router_layers(trace), (std::vector<int>{0, 2}));
  const std::vector<std::vector<double>> layer0 = layer_routing(trace, 0);
  ASSERT_EQ(layer0.size(), 3u);
  EXPECT_EQ(layer0[0], (std::vector<double>{17, 0, 0, 1}));
  EXPECT_EQ(layer0[1], (std::vector<double>{20, 0, 0, 1}));
  EXPECT_EQ(layer0[2], (std::vector<double>{30, 0, 4, 1}));
  // Layer 2 touched only expert 1, yet has the run's four columns.
  const std::vector<std::vector<double>> layer2 = layer_routing(trace, 2);
  ASSERT_EQ(layer2.size(), 3u);
  EXPECT_EQ(layer2[2], (std::vector<double>{0, 11, 0, 0}));
  EXPECT_TRUE(layer_routing(trace, 1).empty());
  EXPECT_TRUE(router_layers(TraceData{}).empty());
}

TEST(RouterSummary, LayerImbalanceIsTheBusiestExpertOverTheMean) {
  const std::vector<LayerImbalance> layers = layer_imbalance(two_rank_trace());
  ASSERT_EQ(layers.size(), 2u);
  EXPECT_EQ(layers[0].layer, 0);
  EXPECT_EQ(layers[0].steps, 3);
  EXPECT_EQ(layers[0].tokens, 18 + 21 + 35);
  EXPECT_EQ(layers[0].hottest_expert, 0);
  // The worst step is step 2: 20 of its 21 tokens on one of 4 experts.
  EXPECT_DOUBLE_EQ(layers[0].worst_max_over_mean, 20.0 * 4 / 21);
  EXPECT_DOUBLE_EQ(layers[1].mean_max_over_mean, 4.0);  // every token on expert 1
}

// The planner's job.expert_moves_per_step: the two-rank trace has 2 layers x 4 experts and router
// statistics up to step 3. Migrations after step 1 (the first: 5 pairs, a one-off the planner
// prices apart) and step 2 (3 pairs, recorded by both ranks, counted once): 3 pairs over 8 pairs
// and the 2 steps after the first migration.
TEST(RouterSummary, ExpertMovesPerStepCountsTheMigrationsAfterTheFirst) {
  TraceData trace = two_rank_trace();
  EXPECT_EQ(expert_moves_per_step(trace), 0);  // no migrations
  trace.migrations.resize(2);
  ExpertMigration first, later;
  first.step = 1;
  first.experts_moved = 5;
  later.step = 2;
  later.experts_moved = 3;
  trace.migrations[0] = {first, later};
  trace.migrations[1] = {later};
  EXPECT_DOUBLE_EQ(expert_moves_per_step(trace), 3.0 / (8 * 2));
  trace.migrations[0] = {first};  // nothing moved after the first placement
  trace.migrations[1].clear();
  EXPECT_EQ(expert_moves_per_step(trace), 0);
}

}  // namespace
}  // namespace rlf
