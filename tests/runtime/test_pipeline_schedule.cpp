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

// Uneven costs per virtual stage: later stages slower, backward twice the forward.
std::vector<double> uneven_forward_costs(const PipelineShape& s) {
  std::vector<double> forward;
  for (int c = 0; c < s.chunks(); ++c) forward.push_back(1.0 + 0.25 * c);
  return forward;
}
std::vector<double> uneven_backward_costs(const PipelineShape& s) {
  std::vector<double> backward = uneven_forward_costs(s);
  for (double& cost : backward) cost *= 2;
  return backward;
}

// (start, end) of every pass: (kind, micro-batch, virtual stage).
using PassTimes = std::map<std::tuple<PassKind, int, int>, std::pair<double, double>>;

// Every pass starts after its input has ended: a forward after the previous virtual stage's
// forward, a backward after the next one's backward (the last virtual stage: after its forward).
void expect_inputs_before_passes(const PipelineShape& s, const PassTimes& when) {
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
    const ScheduleTiming t =
        simulate_schedule(s, schedules, uneven_forward_costs(s), uneven_backward_costs(s));
    PassTimes when;
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
    expect_inputs_before_passes(s, when);
  }
}

// Pairing (Adaptive Pipe / DualPipe): the slots are the schedule's passes in its order; every
// pair is a forward with the backward right after it in the list, of another micro-batch; in the
// 1F1B and interleaved steady state every such neighbour pair is formed where the warm-up is
// whole (m >= p, and for the interleaved schedule m v >= its warm-up); the paired slots of all
// ranks run without deadlock, every pass after its input (a slot after every input of its
// passes) and no slot before the previous one ends.
TEST(PipelineSchedule, PairsAreForwardNextToBackwardAndDependenciesHold) {
  int pairs_total = 0;
  for (const PipelineShape& s : shapes()) {
    SCOPED_TRACE(name(s));
    std::vector<std::vector<PipelineSlot>> schedules;
    for (int r = 0; r < s.stages; ++r) {
      const std::vector<PipelineSlot> slots = paired_schedule(s, r);
      const std::vector<PipelineOp> ops = pipeline_schedule(s, r);
      std::vector<PipelineOp> flat;
      int neighbours = 0, pairs = 0;
      for (size_t i = 0; i + 1 < ops.size(); ++i) {
        if (ops[i].kind == PassKind::Forward && ops[i + 1].kind == PassKind::Backward &&
            ops[i].micro_batch != ops[i + 1].micro_batch) {
          ++neighbours;
          ++i;
        }
      }
      for (const PipelineSlot& slot : slots) {
        ASSERT_GE(slot.size(), 1u);
        ASSERT_LE(slot.size(), 2u);
        if (slot.size() == 2) {
          EXPECT_EQ(slot[0].kind, PassKind::Forward);
          EXPECT_EQ(slot[1].kind, PassKind::Backward);
          EXPECT_NE(slot[0].micro_batch, slot[1].micro_batch);
          ++pairs;
        }
        flat.insert(flat.end(), slot.begin(), slot.end());
      }
      EXPECT_EQ(flat, ops) << "rank " << r;
      EXPECT_LE(pairs, neighbours);
      const bool whole_warmup = s.micro_batches >= s.stages && !s.interleaved();
      if (whole_warmup) {
        EXPECT_EQ(pairs, neighbours) << "rank " << r;
      }
      if (whole_warmup && r + 1 < s.stages) {
        // 1F1B with a whole warm-up: every steady-state slot but the last rank's is a pair.
        EXPECT_EQ(pairs, s.micro_batches - (s.stages - r - 1)) << "rank " << r;
      }
      pairs_total += pairs;
      schedules.push_back(slots);
    }
    const ScheduleTiming t =
        simulate_paired_schedule(s, schedules, uneven_forward_costs(s), uneven_backward_costs(s));
    PassTimes when;
    for (int r = 0; r < s.stages; ++r) {
      size_t i = 0;
      double previous_end = 0;
      for (const PipelineSlot& slot : schedules[size_t(r)]) {
        EXPECT_GE(t.start[size_t(r)][i], previous_end);
        const double slot_start = t.start[size_t(r)][i];
        for (const PipelineOp& op : slot) {
          EXPECT_EQ(t.start[size_t(r)][i], slot_start) << "a pair's passes start together";
          when[{op.kind, op.micro_batch, virtual_stage(s, r, op.chunk)}] = {t.start[size_t(r)][i],
                                                                            t.end[size_t(r)][i]};
          previous_end = t.end[size_t(r)][i];
          ++i;
        }
      }
    }
    expect_inputs_before_passes(s, when);
  }
  EXPECT_GT(pairs_total, 0);
}

// A pair whose backward needs what the forward's pair on the next stage holds back deadlocks:
// with m < p (a warm-up cut short) the neighbour pairs of 1F1B would, and paired_schedule splits
// them.
TEST(PipelineSchedule, PairsThatWouldDeadlockAreSplit) {
  const PipelineShape s{3, 2, 1};
  using K = PassKind;
  // Rank 0's pair (F1 B0) needs rank 1's B0, in rank 1's pair (F1 B0), which needs rank 0's F1.
  const std::vector<std::vector<PipelineSlot>> neighbours = {
      {{{K::Forward, 0, 0}}, {{K::Forward, 1, 0}, {K::Backward, 0, 0}}, {{K::Backward, 1, 0}}},
      {{{K::Forward, 0, 0}}, {{K::Forward, 1, 0}, {K::Backward, 0, 0}}, {{K::Backward, 1, 0}}},
      {{{K::Forward, 0, 0}}, {{K::Backward, 0, 0}}, {{K::Forward, 1, 0}}, {{K::Backward, 1, 0}}}};
  EXPECT_THROW(simulate_paired_schedule(s, neighbours, {1, 1, 1}, {1, 1, 1}), std::logic_error);
  std::vector<std::vector<PipelineSlot>> paired;
  for (int r = 0; r < s.stages; ++r) paired.push_back(paired_schedule(s, r));
  EXPECT_NO_THROW(simulate_paired_schedule(s, paired, {1, 1, 1}, {1, 1, 1}));
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
