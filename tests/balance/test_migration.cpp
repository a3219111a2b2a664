// Migration with a benefit threshold, load prediction, incremental moves and the replay of
// drifting routing traces.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/error.h"
#include "src/balance/incremental_rebalance.h"
#include "src/balance/load_predictor.h"
#include "src/balance/migration_planner.h"
#include "src/balance/rebalance_simulation.h"
#include "src/balance/routing_trace.h"
#include "tests/balance/random_loads.h"

namespace rlf {
namespace {

MigrationOptions options_with(double bandwidth) {
  MigrationOptions m;
  m.bytes_per_expert = 1e6;
  m.intra_node_bandwidth = bandwidth;
  m.inter_node_bandwidth = bandwidth / 4;
  m.arena_bytes = 1e6 * 8;
  m.seconds_per_token = 1e-3;
  m.horizon = 10;
  m.min_gain_ratio = 1.0;
  return m;
}

// 4 experts on 2 devices of 2 slots, one node. Current: the two hot experts share device 0.
const ExpertCluster kCluster{1, 2, 2};
const Placement kCurrent{kCluster, 4, {0, 1, 2, 3}};
const Placement kBalanced{kCluster, 4, {0, 2, 1, 3}};
const std::vector<double> kLoad{100, 100, 10, 10};

TEST(MigrationPlanner, GainCostAndTheThreshold) {
  const MigrationPlan fast = plan_migration(kCurrent, kBalanced, kLoad, options_with(1e9));
  ASSERT_EQ(fast.transfers.size(), 2u);  // experts 1 and 2 swap devices
  // Gain: 10 steps x 1 ms/token x (200 - 110) tokens; cost: one expert each way at 1 GB/s.
  EXPECT_DOUBLE_EQ(fast.gain_seconds, 10 * 1e-3 * 90);
  EXPECT_DOUBLE_EQ(fast.seconds, 1e6 / 1e9);
  EXPECT_DOUBLE_EQ(fast.intra_node_bytes, 2e6);
  EXPECT_TRUE(fast.migrate);
  EXPECT_EQ(fast.reason, "migrate");
  EXPECT_EQ(fast.target.slot_expert, kBalanced.slot_expert);
  // The decision flips where gain = ratio x cost.
  MigrationOptions m = options_with(1e9);
  m.min_gain_ratio = fast.gain_seconds / fast.seconds * 1.01;
  EXPECT_FALSE(plan_migration(kCurrent, kBalanced, kLoad, m).migrate);
  m.min_gain_ratio = fast.gain_seconds / fast.seconds * 0.99;
  EXPECT_TRUE(plan_migration(kCurrent, kBalanced, kLoad, m).migrate);
  // A slow link costs more than the horizon gains: stay.
  const MigrationPlan slow = plan_migration(kCurrent, kBalanced, kLoad, options_with(1e6));
  EXPECT_FALSE(slow.migrate);
  EXPECT_EQ(slow.reason, "below threshold");
  EXPECT_EQ(slow.target.slot_expert, kCurrent.slot_expert);
  EXPECT_EQ(plan_migration(kCurrent, kCurrent, kLoad, options_with(1e9)).reason, "no change");
}

TEST(MigrationPlanner, NeverExceedsTheArena) {
  MigrationOptions m = options_with(1e12);
  m.arena_bytes = 2e6;  // the two slots and no room to receive
  const MigrationPlan plan = plan_migration(kCurrent, kBalanced, kLoad, m);
  EXPECT_FALSE(plan.migrate);
  EXPECT_EQ(plan.reason, "arena");
  EXPECT_DOUBLE_EQ(plan.peak_bytes, 3e6);
  m.arena_bytes = 3e6;
  EXPECT_TRUE(plan_migration(kCurrent, kBalanced, kLoad, m).migrate);
  m.arena_bytes = 1e6;  // cannot even hold the slots
  EXPECT_THROW(plan_migration(kCurrent, kBalanced, kLoad, m), ConfigError);
}

TEST(MigrationPlanner, InterNodeTransfersUseTheSlowerLink) {
  const ExpertCluster two_nodes{2, 1, 2};
  const Placement current{two_nodes, 4, {0, 1, 2, 3}}, target{two_nodes, 4, {0, 2, 1, 3}};
  const MigrationPlan plan = plan_migration(current, target, kLoad, options_with(1e9));
  EXPECT_DOUBLE_EQ(plan.inter_node_bytes, 2e6);
  EXPECT_DOUBLE_EQ(plan.seconds, 1e6 / (1e9 / 4));
}

TEST(MigrationPlanner, OutOfRangeOptionsAreConfigErrors) {
  const auto bad = [](auto change) {
    MigrationOptions m = options_with(1e9);
    change(m);
    return m;
  };
  EXPECT_THROW(bad([](MigrationOptions& m) { m.horizon = 0; }).validate(), ConfigError);
  EXPECT_THROW(bad([](MigrationOptions& m) { m.min_gain_ratio = -1; }).validate(), ConfigError);
  EXPECT_THROW(bad([](MigrationOptions& m) { m.min_gain_ratio = std::nan(""); }).validate(),
               ConfigError);
  EXPECT_THROW(bad([](MigrationOptions& m) {
                 m.min_gain_ratio = std::numeric_limits<double>::infinity();
               }).validate(),
               ConfigError);
  EXPECT_THROW(bad([](MigrationOptions& m) { m.intra_node_bandwidth = 0; }).validate(),
               ConfigError);
  EXPECT_THROW(bad([](MigrationOptions& m) { m.bytes_per_expert = -1; }).validate(), ConfigError);
  EXPECT_NO_THROW(options_with(1e9).validate());
  EXPECT_THROW(LoadPredictorOptions({0.0, 0.1}).validate(), ConfigError);
  EXPECT_THROW(LoadPredictorOptions({1.5, 0.1}).validate(), ConfigError);
  EXPECT_THROW(LoadPredictorOptions({0.3, -0.1}).validate(), ConfigError);
  EXPECT_THROW(LoadPredictor(4, {}).predict(0), ConfigError);
}

TEST(LoadPredictor, FollowsLevelAndTrend) {
  LoadPredictor ema(2, {0.5, 0.0});
  for (int t = 0; t < 40; ++t) ema.observe({100, 7});
  EXPECT_NEAR(ema.predict(5)[0], 100, 1e-9);
  EXPECT_NEAR(ema.predict(5)[1], 7, 1e-9);
  // A ramp of +2 per step: Holt's trend converges to the slope; predicting 4 steps ahead means the
  // level plus the slope at the midpoint (2.5 steps).
  LoadPredictor holt(1, {0.5, 0.3});
  for (int t = 0; t < 200; ++t) holt.observe({10.0 + 2 * t});
  EXPECT_NEAR(holt.predict(4)[0], 10 + 2 * 199 + 2 * 2.5, 1e-6);
  // The EMA alone lags a ramp.
  LoadPredictor lag(1, {0.5, 0.0});
  for (int t = 0; t < 200; ++t) lag.observe({10.0 + 2 * t});
  EXPECT_LT(lag.predict(4)[0], 10 + 2 * 199);
  // Never negative.
  LoadPredictor down(1, {1.0, 1.0});
  down.observe({10});
  down.observe({0});
  EXPECT_EQ(down.predict(10)[0], 0);
}

// A checkpoint's predictor state: a predictor restored from another's level, trend and step
// count predicts what the original does, bit for bit, from then on.
TEST(LoadPredictor, RestoredStateContinuesExactly) {
  const LoadPredictorOptions options{0.3, 0.2};
  LoadPredictor original(3, options), restored(3, options);
  original.observe({10, 20, 30});
  original.observe({12, 17, 31.5});
  restored.restore(original.level(), original.trend(), original.steps_observed());
  EXPECT_EQ(restored.steps_observed(), 2);
  for (const std::vector<double>& step : {std::vector<double>{9, 25, 33}, {1, 2, 3}}) {
    original.observe(step);
    restored.observe(step);
    EXPECT_EQ(restored.predict(7), original.predict(7));
  }
  // A fresh predictor's first observation sets the level: without the restore it differs.
  LoadPredictor fresh(3, options);
  fresh.observe({1, 2, 3});
  EXPECT_NE(fresh.predict(7), original.predict(7));
  EXPECT_THROW(restored.restore({1, 2}, {0, 0}, 1), ConfigError);
  EXPECT_THROW(restored.restore({1, 2, 3}, {0, 0, 0}, -1), ConfigError);
}

TEST(IncrementalMoves, EachMoveLowersTheMaximumOrTheSpread) {
  DriftingZipfRouter router({64, 4096, 8, 1.2, 1, 3});
  const std::vector<double> load = router.next_step();
  const Placement start = round_robin_placement({2, 4, 9}, 64);
  MigrationOptions m = options_with(1e9);
  m.arena_bytes = 1e6 * 18;
  const std::vector<Placement> path = incremental_moves(start, load, m, 16);
  ASSERT_FALSE(path.empty());
  double previous = max_of(start.device_loads(load));
  for (const Placement& p : path) {
    ASSERT_TRUE(p.valid());
    const double now = max_of(p.device_loads(load));
    EXPECT_LE(now, previous);
    previous = now;
  }
  EXPECT_LT(previous, max_of(start.device_loads(load)));
  const MigrationPlan plan = best_plan(start, path, load, m);
  EXPECT_TRUE(plan.migrate);
}

// The case the swaps once got wrong: 4 experts on 2 devices of 3 slots, experts 0 and 2
// replicated on both. The hottest device (0: 8 + 4 + 0.5 = 12.5 against 8.5) could cut its
// maximum to 12 by swapping its replica of expert 2 for device 1's replica of expert 0, which
// leaves each device with two copies of one expert: no more capacity, a table the EP dispatcher
// refuses. The first move must hold every expert at most once per device and still lower the
// maximum (giving up a surplus replica for one of the hot expert 3 does: 9 and 12).
TEST(IncrementalMoves, NeverSwapsASecondCopyOntoADevice) {
  const Placement current{{1, 2, 3}, 4, {2, 0, 3, 2, 0, 1}};
  const std::vector<double> load{1, 4, 8, 8};
  ASSERT_TRUE(current.one_copy_per_device());
  const std::vector<Placement> path = incremental_moves(current, load, options_with(1e9), 1);
  ASSERT_EQ(path.size(), 1u);
  EXPECT_NE(path[0].slot_expert, (std::vector<int>{0, 0, 3, 2, 2, 1}));
  EXPECT_TRUE(path[0].one_copy_per_device());
  EXPECT_TRUE(path[0].valid());
  EXPECT_LT(max_of(path[0].device_loads(load)), max_of(current.device_loads(load)));
}

// Over random clusters (1-3 nodes x 1-4 devices, 0-2 spare slots per device) and random loads
// (Zipf 0-3, uniform integers, a few very hot experts), from placements that replicate other
// loads' hot experts: every proposal of any length keeps each device's slots, holds every expert,
// never holds one twice on a device, and never raises the maximum device load.
TEST(IncrementalMoves, ProposalsKeepOneCopyPerDeviceAndNeverRaiseTheMaximum) {
  std::mt19937_64 g(23);
  int proposals = 0, replicated = 0;
  for (int instance = 0; instance < 400; ++instance) {
    const int nodes = 1 + int(g() % 3), per_node = 1 + int(g() % 4);
    const int devices = nodes * per_node, own = 1 + int(g() % 4), spare = int(g() % 3);
    const int experts = devices * own;
    const ExpertCluster cluster{nodes, per_node, std::min(experts, own + spare)};
    auto random_loads = [&] {
      std::vector<double> w = test::zipf_loads(experts, double(g() % 300) / 100, g);
      if (instance % 3 == 1) {
        for (double& x : w) x = double(g() % 1000);
      } else if (instance % 3 == 2) {
        for (double& x : w) x = g() % 5 == 0 ? 5000.0 : 10.0;
      }
      return w;
    };
    const Placement current = place_two_level(random_loads(), cluster);
    ASSERT_TRUE(current.one_copy_per_device());
    const std::vector<double> load = random_loads();
    const std::vector<Placement> path = incremental_moves(current, load, options_with(1e9), 32);
    double previous = max_of(current.device_loads(load));
    for (const Placement& p : path) {
      ASSERT_EQ(p.slot_expert.size(), size_t(cluster.slots())) << "instance " << instance;
      ASSERT_TRUE(p.valid()) << "instance " << instance;
      ASSERT_TRUE(p.one_copy_per_device()) << "instance " << instance;
      const double now = max_of(p.device_loads(load));
      ASSERT_LE(now, previous) << "instance " << instance;
      previous = now;
      replicated += cluster.slots() > experts;
      ++proposals;
    }
  }
  EXPECT_GT(proposals, 400);
  EXPECT_GT(replicated, 100);
}

TEST(RoutingTrace, CountsAndDeterminism) {
  DriftingZipfRouter a({16, 500, 4, 1.2, 2, 7}), b({16, 500, 4, 1.2, 2, 7});
  for (int t = 0; t < 5; ++t) {
    const std::vector<double> x = a.next_step();
    EXPECT_EQ(x, b.next_step());
    double total = 0;
    for (double c : x) {
      EXPECT_LE(c, 500);  // distinct experts per token
      total += c;
    }
    EXPECT_EQ(total, 500 * 4);
  }
  EXPECT_THROW(DriftingZipfRouter({16, 500, 17, 1.2, 2, 7}), ConfigError);
  EXPECT_THROW(DriftingZipfRouter({16, 500, 4, -1, 2, 7}), ConfigError);
}

TEST(RebalanceSimulation, OursBeatsStaticAndStaysInTheArena) {
  DriftingZipfRouter router({64, 4096, 8, 1.2, 1, 1});
  std::vector<std::vector<double>> trace;
  for (int t = 0; t <= 40; ++t) trace.push_back(router.next_step());
  RebalanceOptions o;
  o.cluster = {2, 4, 9};
  o.interval = 5;
  o.migration = options_with(1e9);
  o.migration.bytes_per_expert = 1e3;  // cheap moves
  o.migration.arena_bytes = 1e3 * 10;  // room to receive one expert per device at a time
  const RebalanceResult ours = simulate_rebalancing(trace, BalancePolicy::Ours, o);
  const RebalanceResult fixed = simulate_rebalancing(trace, BalancePolicy::Static, o);
  const RebalanceResult eplb = simulate_rebalancing(trace, BalancePolicy::Eplb, o);
  EXPECT_LT(ours.imbalance, fixed.imbalance);
  EXPECT_LT(eplb.imbalance, fixed.imbalance);
  EXPECT_LE(ours.peak_bytes, o.migration.arena_bytes);
  EXPECT_LE(eplb.peak_bytes, o.migration.arena_bytes);
  EXPECT_GE(ours.load_imbalance, 1.0);
  EXPECT_GE(ours.imbalance, ours.load_imbalance);
  // Same inputs, same figures.
  EXPECT_EQ(simulate_rebalancing(trace, BalancePolicy::Ours, o).imbalance, ours.imbalance);
  // A threshold nothing can pass: no migration at all.
  o.migration.min_gain_ratio = 1e300;
  const RebalanceResult never = simulate_rebalancing(trace, BalancePolicy::Ours, o);
  EXPECT_EQ(never.migrations, 0);
  EXPECT_EQ(never.imbalance, never.load_imbalance);
  o.interval = 0;
  EXPECT_THROW(simulate_rebalancing(trace, BalancePolicy::Ours, o), ConfigError);
}

}  // namespace
}  // namespace rlf
