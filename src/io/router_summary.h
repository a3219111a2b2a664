// What `rlfusion report` says of a trace's router statistics and expert migrations (EDPB,
// docs/EDPB.md): per layer, how unevenly the routed tokens fell on the experts, and every
// migration with its bytes summed over the ranks that moved experts.
#pragma once

#include <cstdint>
#include <vector>

#include "src/io/trace_reader.h"

namespace rlf {

// One layer over the run: per step, the tokens of every rank summed per expert; max/mean is the
// busiest expert's tokens over the mean expert's (1 = perfectly even).
struct LayerImbalance {
  int layer = 0;
  int steps = 0;                   // steps with router statistics
  int64_t tokens = 0;              // (token, slot) assignments, all steps and ranks
  double mean_max_over_mean = 0;   // averaged over steps
  double worst_max_over_mean = 0;  // the worst step's
  int hottest_expert = 0;          // most tokens over the run
  double hottest_share = 0;        // its share of the layer's tokens
};

// Layers in ascending order; empty when the trace has no router statistics.
std::vector<LayerImbalance> layer_imbalance(const TraceData& trace);

// The router's concentration as the planner takes it (the RL job's `router_max_over_mean`): the
// layers' max/mean (each averaged over steps) averaged over the layers, since every layer's
// exchange waits for its own hottest expert's rank; 0 without router statistics.
double router_max_over_mean(const std::vector<LayerImbalance>& layers);

// Layers with router statistics, ascending.
std::vector<int> router_layers(const TraceData& trace);

// One layer's tokens per expert per step, summed over ranks: the table `bench balance
// --routing-trace` replays (docs/EDPB.md). Steps ascending (those with statistics for the layer);
// every row has one column per expert of the run (1 + the largest expert id of any layer), 0
// where no token went. Empty when the layer has no statistics.
std::vector<std::vector<double>> layer_routing(const TraceData& trace, int layer);

// Migrations by step (ascending): bytes summed over ranks, the other fields from the lowest rank
// that recorded the step.
std::vector<ExpertMigration> migrations_of(const TraceData& trace);

// The planner's job.expert_moves_per_step (src/sim/rl_job.h) from a run: the (layer, expert) pairs
// the migrations after the first moved (the first replaces the starting blocks, a one-off the
// planner prices on its own), over the model's pairs (the router statistics' layers x experts),
// per step from the first migration's step to the last step with router statistics. 0 without
// migrations or router statistics (a run that moved nothing after its first placement: 0 too).
double expert_moves_per_step(const TraceData& trace);

}  // namespace rlf
