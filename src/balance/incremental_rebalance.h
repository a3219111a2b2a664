// Migration-aware rebalancing: instead of placing from scratch (which moves most experts), start
// from the current placement and take one cheap move at a time, each chosen for the largest cut
// in the maximum predicted device load per second of transfer: swap the experts of two slots on
// different devices, or turn a spare replica's slot into a replica of a hotter expert. The
// migration planner then keeps the prefix of moves whose gain beats its cost by the most.
#pragma once

#include <vector>

#include "src/balance/expert_placement.h"
#include "src/balance/migration_planner.h"

namespace rlf {

// Placements after 1, 2, ... moves (at most `max_moves`; fewer when no move lowers the maximum
// device load). Moves across nodes are charged the inter-node bandwidth of `options`. Every
// placement keeps each device's slot count, holds every expert, never holds an expert twice on
// one device (a second copy there adds no capacity) when `current` does not, and has a maximum
// device load no higher than the placement before it.
std::vector<Placement> incremental_moves(const Placement& current,
                                         const std::vector<double>& predicted_load,
                                         const MigrationOptions& options, int max_moves);

// Of the proposals, the plan with the largest net benefit (gain - min_gain_ratio x cost) among
// those the planner would carry out; when none qualifies, a refusal: for cost if any proposal
// fitted the arena, else for the arena ("no change" when every proposal is the current placement).
MigrationPlan best_plan(const Placement& current, const std::vector<Placement>& proposals,
                        const std::vector<double>& predicted_load, const MigrationOptions& options);

// Ours at a decision point: the best plan (best_plan) among the incremental moves from
// `current` and the fresh two-level placement on `current`'s cluster, renumbered to move as
// little as possible (align_to).
MigrationPlan plan_rebalance(const Placement& current, const std::vector<double>& predicted_load,
                             const MigrationOptions& options, int max_moves);

}  // namespace rlf
