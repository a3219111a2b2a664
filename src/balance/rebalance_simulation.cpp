#include "src/balance/rebalance_simulation.h"

#include <algorithm>
#include <string>

#include "kernels/error.h"
#include "src/balance/eplb_baseline.h"
#include "src/balance/incremental_rebalance.h"

namespace rlf {

const char* balance_policy_name(BalancePolicy policy) {
  switch (policy) {
    case BalancePolicy::Static:
      return "static";
    case BalancePolicy::Ours:
      return "ours";
    case BalancePolicy::Eplb:
      return "eplb";
  }
  return "?";
}

void RebalanceOptions::validate(int experts) const {
  cluster.validate(experts);
  if (interval < 1) {
    throw ConfigError("--rebalance-interval must be >= 1, got " + std::to_string(interval));
  }
  predictor.validate();
  migration.validate();
}

namespace {

// The plan of a policy at a decision point; fresh placements are renumbered to move as little
// as possible.
MigrationPlan decide(BalancePolicy policy, const RebalanceOptions& o,
                     const LoadPredictor& predictor, const std::vector<std::vector<double>>& trace,
                     size_t step, const Placement& current, const MigrationOptions& migration) {
  std::vector<double> expected;
  if (policy == BalancePolicy::Ours) {
    expected = predictor.predict(o.interval);
    return plan_rebalance(current, expected, migration, o.max_moves);
  }
  // EPLB: the mean of the last `interval` steps (or fewer at the start).
  const size_t first = step + 1 >= size_t(o.interval) ? step + 1 - size_t(o.interval) : 0;
  expected.assign(trace[step].size(), 0.0);
  for (size_t t = first; t <= step; ++t) {
    for (size_t e = 0; e < expected.size(); ++e)
      expected[e] += trace[t][e] / double(step + 1 - first);
  }
  MigrationPlan plan =
      plan_migration(current, align_to(place_eplb(expected, o.cluster, o.eplb_groups), current),
                     expected, migration);
  // EPLB knows no migration cost: it adopts every proposal that fits.
  if (plan.reason == "below threshold") {
    plan.migrate = true;
    plan.target = align_to(place_eplb(expected, o.cluster, o.eplb_groups), current);
  }
  return plan;
}

}  // namespace

RebalanceResult simulate_rebalancing(const std::vector<std::vector<double>>& trace,
                                     BalancePolicy policy, const RebalanceOptions& options) {
  if (trace.size() < 2) throw ConfigError("rebalancing: the trace needs >= 2 steps");
  const int experts = int(trace[0].size());
  options.validate(experts);
  const MigrationOptions& migration = options.migration;
  const double spt = migration.seconds_per_token;

  RebalanceResult r;
  r.policy = policy;
  r.slots_per_device = options.cluster.slots_per_device;
  r.interval = options.interval;
  LoadPredictor predictor(experts, options.predictor);
  predictor.observe(trace[0]);
  Placement current = round_robin_placement(options.cluster, experts);
  if (policy == BalancePolicy::Ours) current = place_two_level(trace[0], options.cluster);
  if (policy == BalancePolicy::Eplb)
    current = place_eplb(trace[0], options.cluster, options.eplb_groups);

  double pending_seconds = 0;  // migration done before the next step
  const size_t measured = trace.size() - 1;
  for (size_t step = 1; step < trace.size(); ++step) {
    const std::vector<double> load = current.device_loads(trace[step]);
    const double mean = mean_of(load), peak = max_of(load);
    const double with_migration = mean > 0 ? (peak + pending_seconds / spt) / mean : 1.0;
    r.imbalance += with_migration / double(measured);
    r.load_imbalance += (mean > 0 ? peak / mean : 1.0) / double(measured);
    r.worst_step = std::max(r.worst_step, with_migration);
    r.expert_seconds_per_step += (peak * spt + pending_seconds) / double(measured);
    pending_seconds = 0;
    predictor.observe(trace[step]);

    if (policy == BalancePolicy::Static || step % size_t(options.interval) != 0) continue;
    if (step + 1 == trace.size()) break;  // nothing left to serve
    ++r.decisions;
    const MigrationPlan plan = decide(policy, options, predictor, trace, step, current, migration);
    if (plan.reason == "below threshold" && !plan.migrate) ++r.refused_threshold;
    if (plan.reason == "arena") ++r.refused_arena;
    if (!plan.migrate) continue;
    ++r.migrations;
    current = plan.target;
    r.intra_node_bytes += plan.intra_node_bytes;
    r.inter_node_bytes += plan.inter_node_bytes;
    r.migration_seconds += plan.seconds;
    r.peak_bytes = std::max(r.peak_bytes, plan.peak_bytes);
    pending_seconds = plan.seconds;
  }
  r.final_placement = current;
  return r;
}

}  // namespace rlf
