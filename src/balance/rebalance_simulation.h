// Replays router statistics (tokens per expert, step by step) against a balancing policy and
// measures what each step's devices really received: the max/mean device load per step with the
// time of any migration before the step counted as extra load on the slowest device.
// Policies: "static" (round-robin, never moved), "ours" (predicted loads, two-level placement,
// migration only above the benefit threshold) and "eplb" (EPLB's placement of the last window's
// mean load, always adopted unless it does not fit the arena). Ours weighs every prefix of its
// incremental moves and the from-scratch two-level placement, and carries out the best net one.
#pragma once

#include <string>
#include <vector>

#include "src/balance/expert_placement.h"
#include "src/balance/load_predictor.h"
#include "src/balance/migration_planner.h"

namespace rlf {

enum class BalancePolicy { Static, Ours, Eplb };
const char* balance_policy_name(BalancePolicy policy);

struct RebalanceOptions {
  ExpertCluster cluster;
  int interval = 5;     // steps between decisions (>= 1)
  int eplb_groups = 8;  // EPLB's expert groups
  int max_moves = 16;   // ours: incremental moves considered per decision
  LoadPredictorOptions predictor;
  MigrationOptions migration;  // its horizon is also ours' prediction horizon

  void validate(int experts) const;  // ConfigError naming the option
};

struct RebalanceResult {
  BalancePolicy policy = BalancePolicy::Static;
  int slots_per_device = 0, interval = 0;
  double imbalance = 0;       // mean over measured steps of (max + migration) / mean device load
  double load_imbalance = 0;  // the same without migration time
  double worst_step = 0;      // largest per-step (max + migration) / mean
  int decisions = 0, migrations = 0, refused_threshold = 0, refused_arena = 0;
  double intra_node_bytes = 0, inter_node_bytes = 0, migration_seconds = 0;
  double expert_seconds_per_step = 0;  // mean of max load x seconds_per_token + migration time
  double peak_bytes = 0;               // largest device expert memory of any migration
  Placement final_placement;
};

// trace[0] is a profiling step every policy observes before the first measured step (ours and
// EPLB place from it; static ignores it); steps 1 .. trace.size() - 1 are measured.
RebalanceResult simulate_rebalancing(const std::vector<std::vector<double>>& trace,
                                     BalancePolicy policy, const RebalanceOptions& options);

}  // namespace rlf
