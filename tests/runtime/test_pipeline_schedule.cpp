// The pipeline schedules as pure functions, for many (p, m, v): every pass exactly once, each
// micro-batch chunk's forward before its backward, the ranks' orders free of deadlock across
// stages, at most the schedule's bound of activations in flight, and under unit costs an idle
// share of exactly (p - 1) / (m v + p - 1) on every rank. Bad shapes are ConfigErrors.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/error.h"
#include "src/runtime/pipeline_schedule.h"

namespace rlf {
namespace {

std::vector<PipelineShape> shapes() {
  std::vector<PipelineShape> out;
  for (int p : {1, 2, 3, 4, 8}) {
    for (int v : {1, 2, 3, 4}) {
      for (int groups : {1, 2, 3, 5}) {
        out.push_back({p, p * groups, v});
      }
      if (v == 1) {
        for (int m : {1, 2, 3, 7}) out.push_back({p, m, 1});  // 1F1B takes any m, even < p
      }
    }
  }
  return out;
}

std::string name(const PipelineShape& s) {
  return "p=" + std::to_string(s.stages) + " m=" + std::to_string(s.micro_batches) +
         " v=" + std::to_string(s.virtual_stages);
}

TEST(PipelineSchedule, EveryPassOnceForwardBeforeBackwardWithinTheInFlightBound) {
  for (const PipelineShape& s : shapes()) {
    SCOPED_TRACE(name(s));
    for (int r = 0; r < s.stages; ++r) {
      const std::vector<PipelineOp> ops = pipeline_schedule(s, r);
      ASSERT_EQ(int(ops.size()), 2 * s.micro_batches * s.virtual_stages);
      std::set<std::tuple<PassKind, int, int>> seen;
      for (const PipelineOp& op : ops) {
        ASSERT_GE(op.micro_batch, 0);
        ASSERT_LT(op.micro_batch, s.micro_batches);
        ASSERT_GE(op.chunk, 0);
        ASSERT_LT(op.chunk, s.virtual_stages);
        ASSERT_TRUE(seen.insert({op.kind, op.micro_batch, op.chunk}).second) << "repeated pass";
        if (op.kind == PassKind::Backward) {
          EXPECT_TRUE(seen.count({PassKind::Forward, op.micro_batch, op.chunk}))
              << "backward of micro-batch " << op.micro_batch << " chunk " << op.chunk
              << " before its forward on rank " << r;
        }
      }
      EXPECT_LE(in_flight_peak(ops), in_flight_bound(s, r));
      EXPECT_EQ(in_flight_peak(ops), in_flight_bound(s, r)) << "the bound is reached";
    }
  }
}

TEST(PipelineSchedule, OneFOneBHoldsAtMostTheDepthOfThePipeline) {
  for (int p : {1, 2, 4, 8}) {
    for (int m : {1, 3, 8, 16}) {
      const PipelineShape s{p, m, 1};
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(in_flight_peak(pipeline_schedule(s, r)), std::min(p - r, m)) << name(s);
      }
    }
  }
  // Interleaved holds more chunks, each 1/v of the rank's layers: rank 0 of p = 4, v = 2 holds
  // 2 (p - 1) + (v - 1) p + 1 = 11 chunks = 5.5 stages' worth, 1F1B's 4 stages.
  EXPECT_EQ(in_flight_peak(pipeline_schedule({4, 8, 2}, 0)), 11);
}

TEST(PipelineSchedule, KnownOrdersForSmallShapes) {
  using K = PassKind;
  // 1F1B, p = 2, m = 3: rank 0 warms up with one forward.
  const std::vector<PipelineOp> r0 = {{K::Forward, 0, 0}, {K::Forward, 1, 0},  {K::Backward, 0, 0},
                                      {K::Forward, 2, 0}, {K::Backward, 1, 0}, {K::Backward, 2, 0}};
  EXPECT_EQ(pipeline_schedule({2, 3, 1}, 0), r0);
  // Interleaved, p = 2, m = 2, v = 2, rank 1: warm-up (v - 1) p = 2 forwards (chunk 0 of
  // micro-batches 0, 1), then forward chunk 1 / backward chunk 1 alternately.
  const std::vector<PipelineOp> r1 = {{K::Forward, 0, 0},  {K::Forward, 1, 0}, {K::Forward, 0, 1},
                                      {K::Backward, 0, 1}, {K::Forward, 1, 1}, {K::Backward, 1, 1},
                                      {K::Backward, 0, 0}, {K::Backward, 1, 0}};
  EXPECT_EQ(pipeline_schedule({2, 2, 2}, 1), r1);
}

TEST(PipelineSchedule, UnitCostsIdleExactlyTheFormulaOnEveryRank) {
  for (const PipelineShape& s : shapes()) {
    SCOPED_TRACE(name(s));
    const ScheduleTiming t = simulate_unit_schedule(s);
    const double mv = double(s.micro_batches) * s.virtual_stages;
    EXPECT_DOUBLE_EQ(t.makespan, 2 * mv + 2 * (s.stages - 1));
    for (int r = 0; r < s.stages; ++r) {
      EXPECT_DOUBLE_EQ(t.busy[size_t(r)], 2 * mv);
      EXPECT_NEAR(t.bubble_fraction(r), bubble_formula(s), 1e-12);
    }
  }
}

// The forward-only pass (the KL reference's): every forward once, in the schedule's order, and
// the stages never deadlock.
TEST(PipelineSchedule, ForwardOnlyRunsEveryForwardOnceWithoutDeadlock) {
  for (const PipelineShape& s : shapes()) {
    SCOPED_TRACE(name(s));
    std::vector<std::vector<PipelineOp>> schedules;
    for (int r = 0; r < s.stages; ++r) {
      schedules.push_back(forward_only_schedule(s, r));
      std::vector<PipelineOp> forwards;
      for (const PipelineOp& op : pipeline_schedule(s, r)) {
        if (op.kind == PassKind::Forward) forwards.push_back(op);
      }
      EXPECT_EQ(schedules.back(), forwards);
      EXPECT_EQ(int(forwards.size()), s.micro_batches * s.virtual_stages);
    }
    const std::vector<double> unit(size_t(s.chunks()), 1.0);
    const ScheduleTiming t = simulate_schedule(s, schedules, unit, unit);
    // All forwards, no backward: the last virtual stage's last forward ends after m v + p v - 1
    // slots at most.
    EXPECT_LE(t.makespan, double(s.micro_batches * s.virtual_stages + s.chunks() - 1));
  }
}

TEST(PipelineSchedule, SimulationRespectsDependenciesAcrossStages) {
  for (const PipelineShape& s : shapes()) {
    SCOPED_TRACE(name(s));
    std::vector<std::vector<PipelineOp>> schedules;
    for (int r = 0; r < s.stages; ++r) schedules.push_back(pipeline_schedule(s, r));
    // Uneven costs: later stages slower, backward twice the forward.
    std::vector<double> forward, backward;
    for (int c = 0; c < s.chunks(); ++c) {
      forward.push_back(1.0 + 0.25 * c);
      backward.push_back(2.0 * forward.back());
    }
    const ScheduleTiming t = simulate_schedule(s, schedules, forward, backward);
    std::map<std::tuple<PassKind, int, int>, std::pair<double, double>> when;
    for (int r = 0; r < s.stages; ++r) {
      for (size_t i = 0; i < schedules[size_t(r)].size(); ++i) {
        const PipelineOp& op = schedules[size_t(r)][i];
        when[{op.kind, op.micro_batch, virtual_stage(s, r, op.chunk)}] = {t.start[size_t(r)][i],
                                                                          t.end[size_t(r)][i]};
        if (i > 0) {
          EXPECT_GE(t.start[size_t(r)][i], t.end[size_t(r)][i - 1]);
        }
      }
    }
    const int last = s.chunks() - 1;
    for (int b = 0; b < s.micro_batches; ++b) {
      for (int c = 0; c < s.chunks(); ++c) {
        const auto f = when.at({PassKind::Forward, b, c});
        const auto g = when.at({PassKind::Backward, b, c});
        if (c > 0) {
          EXPECT_GE(f.first, when.at({PassKind::Forward, b, c - 1}).second);
        }
        EXPECT_GE(g.first, c < last ? when.at({PassKind::Backward, b, c + 1}).second : f.second);
      }
    }
  }
}

TEST(PipelineSchedule, DeadlockIsDetected) {
  // Rank 0 waits for micro-batch 0's backward before it runs the forward rank 1 needs first.
  const PipelineShape s{2, 1, 1};
  using K = PassKind;
  const std::vector<std::vector<PipelineOp>> bad = {{{K::Backward, 0, 0}, {K::Forward, 0, 0}},
                                                    {{K::Forward, 0, 0}, {K::Backward, 0, 0}}};
  EXPECT_THROW(simulate_schedule(s, bad, {1, 1}, {1, 1}), std::logic_error);
}

TEST(PipelineSchedule, BadShapesAreConfigErrorsNamingTheOption) {
  auto message = [](const PipelineShape& s, int layers, int world, bool balanced = false) {
    try {
      validate_pipeline(s, layers, world, balanced);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message({2, 4, 2}, 8, 4), "");
  EXPECT_EQ(message({4, 3, 1}, 8, 4), "") << "1F1B takes fewer micro-batches than stages";
  EXPECT_NE(message({2, 4, 3}, 8, 2).find("--virtual-stages 3"), std::string::npos);
  EXPECT_NE(message({2, 4, 3}, 8, 2).find("divide the model's 8 layers"), std::string::npos);
  EXPECT_EQ(message({2, 4, 3}, 8, 2, /*balanced=*/true), "");
  EXPECT_NE(message({3, 4, 3}, 8, 3, true).find("not exceed"), std::string::npos);
  EXPECT_NE(message({3, 3, 1}, 6, 4).find("must divide the world size 4"), std::string::npos);
  EXPECT_NE(message({4, 2, 2}, 8, 4).find("--micro-batches 2"), std::string::npos);
  EXPECT_NE(message({4, 6, 2}, 8, 4).find("multiple of --pipeline-parallel 4"), std::string::npos);
  EXPECT_NE(message({2, 0, 1}, 8, 2).find(">= 1"), std::string::npos);
}

TEST(PipelineSchedule, ShapesThatValidationRefusesWouldDeadlock) {
  // Interleaved with m not a multiple of p: the groups of p micro-batches break.
  for (const PipelineShape& s : {PipelineShape{2, 3, 2}, PipelineShape{4, 2, 2}}) {
    EXPECT_ANY_THROW(simulate_unit_schedule(s)) << name(s);
  }
}

}  // namespace
}  // namespace rlf
