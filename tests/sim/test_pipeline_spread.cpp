// The planner's closed form for a 1F1B pipeline whose micro-batches differ in length
// (src/sim/cost_model.cpp, training_cost: the stage's work times E[max of P standard normals] x the
// micro-batches' coefficient of variation, above the equal-work schedule) against a discrete-event
// simulation of the schedule the runtime runs (src/runtime/pipeline_schedule.h: P - s - 1 warm-up
// forwards on stage s, then one forward and one backward in turn, then the last backwards), with
// every stage doing the same work on a micro-batch (a third forward, two thirds backward) and free
// hand-offs.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "src/sim/expert_load.h"

namespace rlf::sim {
namespace {

// The time the 1F1B schedule of `work.size()` micro-batches takes on `stages` stages.
double one_f_one_b_seconds(int stages, const std::vector<double>& work) {
  const int m = int(work.size());
  struct Pass {
    bool forward;
    int micro_batch;
  };
  std::vector<std::vector<Pass>> order(size_t(stages), std::vector<Pass>{});
  for (int s = 0; s < stages; ++s) {
    const int warm_up = std::min(stages - s - 1, m);
    int forwards = 0;
    for (; forwards < warm_up; ++forwards) order[size_t(s)].push_back({true, forwards});
    for (int backwards = 0; backwards < m; ++backwards) {
      if (forwards < m) order[size_t(s)].push_back({true, forwards++});
      order[size_t(s)].push_back({false, backwards});
    }
  }
  // End times of (forward?, stage, micro-batch); a pass starts when its stage is free and its
  // input has arrived: a forward's from the stage before, a backward's from the stage after (the
  // last stage's from its own forward).
  std::map<std::tuple<bool, int, int>, double> ended;
  std::vector<double> free_at(size_t(stages), 0.0);
  std::vector<size_t> next(size_t(stages), 0);
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int s = 0; s < stages; ++s) {
      while (next[size_t(s)] < order[size_t(s)].size()) {
        const Pass pass = order[size_t(s)][next[size_t(s)]];
        const auto input = pass.forward      ? std::make_tuple(true, s - 1, pass.micro_batch)
                           : s == stages - 1 ? std::make_tuple(true, s, pass.micro_batch)
                                             : std::make_tuple(false, s + 1, pass.micro_batch);
        double ready = 0;
        if (!(pass.forward && s == 0)) {
          const auto found = ended.find(input);
          if (found == ended.end()) break;
          ready = found->second;
        }
        const double seconds = work[size_t(pass.micro_batch)] * (pass.forward ? 1.0 / 3 : 2.0 / 3);
        free_at[size_t(s)] = std::max(free_at[size_t(s)], ready) + seconds;
        ended[{pass.forward, s, pass.micro_batch}] = free_at[size_t(s)];
        ++next[size_t(s)];
        progressed = true;
      }
    }
  }
  for (int s = 0; s < stages; ++s) EXPECT_EQ(next[size_t(s)], order[size_t(s)].size()) << s;
  return *std::max_element(free_at.begin(), free_at.end());
}

TEST(PipelineSpread, EqualMicroBatchesTakeTheBubbleFormulasTime) {
  for (const int stages : {2, 4, 8}) {
    const std::vector<double> work(32, 1.0);
    // (m + P - 1) micro-batches' time: the work and the (P - 1) / m bubble.
    EXPECT_NEAR(one_f_one_b_seconds(stages, work), 32 + stages - 1, 1e-12) << stages;
  }
}

// Micro-batches of lognormal lengths (coefficient of variation 0.1 and 0.3), 64 of them, 2-8
// stages, 60 draws each: the schedule's mean excess over equal micro-batches of the same total,
// per unit of a stage's work, against the closed form. Within 25% (the closed form treats every
// period as a lock-step meeting of the P micro-batches in flight; 1F1B's queued passes absorb part
// of the spread at few stages, and long tails add to it at many).
TEST(PipelineSpread, ClosedFormFollowsASimulationOfOneFOneB) {
  std::mt19937_64 gen(20261206);
  for (const int stages : {2, 4, 8}) {
    for (const double cv : {0.1, 0.3}) {
      const double sigma = std::sqrt(std::log(1 + cv * cv));
      std::lognormal_distribution<double> length(-sigma * sigma / 2, sigma);
      double excess = 0;
      const int draws = 60, m = 64;
      for (int d = 0; d < draws; ++d) {
        std::vector<double> work(m);
        for (double& w : work) w = length(gen);
        const double total = std::accumulate(work.begin(), work.end(), 0.0);
        const double equal = total + (stages - 1) * total / m;
        excess += (one_f_one_b_seconds(stages, work) - equal) / total / draws;
      }
      const double closed_form = expected_max_of_normals(stages) * cv;
      EXPECT_NEAR(excess / closed_form, 1.0, 0.25)
          << stages << " stages, cv " << cv << ": simulated " << excess << ", closed form "
          << closed_form;
    }
  }
}

}  // namespace
}  // namespace rlf::sim
