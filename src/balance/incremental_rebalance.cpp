#include "src/balance/incremental_rebalance.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "kernels/error.h"

namespace rlf {

namespace {

struct Score {
  double max = 0, squares = 0;  // the maximum device load, then the spread as a tie-break
};

Score score_of(const Placement& p, const std::vector<double>& load) {
  Score s;
  for (double x : p.device_loads(load)) {
    s.max = std::max(s.max, x);
    s.squares += x * x;
  }
  return s;
}

}  // namespace

std::vector<Placement> incremental_moves(const Placement& current,
                                         const std::vector<double>& predicted_load,
                                         const MigrationOptions& options, int max_moves) {
  const ExpertCluster& c = current.cluster;
  const int spd = c.slots_per_device, slots = c.slots();
  std::vector<Placement> out;
  Placement p = current;
  for (int move = 0; move < max_moves; ++move) {
    const Score now = score_of(p, predicted_load);
    const std::vector<double> device = p.device_loads(predicted_load);
    const int hottest = int(std::max_element(device.begin(), device.end()) - device.begin());
    const std::vector<int> replicas = p.replicas();
    double best_rate = 0, best_squares = std::numeric_limits<double>::infinity();
    Placement best;
    auto consider = [&](Placement& candidate, bool inter_node) {
      const Score s = score_of(candidate, predicted_load);
      const double cut = now.max - s.max;
      const double seconds = options.bytes_per_expert / (inter_node ? options.inter_node_bandwidth
                                                                    : options.intra_node_bandwidth);
      const double rate = cut / seconds;
      // A move must lower the maximum, or keep it and lower the spread (the next move can then
      // lower the maximum); the best cut per second of transfer wins.
      const bool useful = cut > 0 || (cut == 0 && s.squares < now.squares * (1 - 1e-9));
      if (useful && (rate > best_rate || (rate == best_rate && s.squares < best_squares))) {
        best_rate = rate;
        best_squares = s.squares;
        best = candidate;
      }
    };
    auto holds = [&](int device, int expert) {
      for (int t = device * spd; t < (device + 1) * spd; ++t) {
        if (p.slot_expert[size_t(t)] == expert) return true;
      }
      return false;
    };
    for (int i = hottest * spd; i < (hottest + 1) * spd; ++i) {
      for (int j = 0; j < slots; ++j) {
        const int other = j / spd;
        if (other == hottest) continue;
        const bool inter = c.node_of(other) != c.node_of(hottest);
        const int hot = p.slot_expert[size_t(i)], spare = p.slot_expert[size_t(j)];
        const bool other_holds_hot = holds(other, hot);
        // Swap the two slots' experts, unless either device already holds the expert it would
        // receive (with replicas: a second copy on one device adds no capacity).
        if (hot != spare && !other_holds_hot && !holds(hottest, spare)) {
          Placement candidate = p;
          std::swap(candidate.slot_expert[size_t(i)], candidate.slot_expert[size_t(j)]);
          consider(candidate, inter);
        }
        // Re-replicate: slot j gives up a surplus replica for one more of slot i's expert.
        if (replicas[size_t(spare)] >= 2 && !other_holds_hot) {
          Placement copy = p;
          copy.slot_expert[size_t(j)] = hot;
          consider(copy, inter);
        }
      }
    }
    if (best.slot_expert.empty()) break;
    p = best;
    out.push_back(p);
  }
  return out;
}

MigrationPlan best_plan(const Placement& current, const std::vector<Placement>& proposals,
                        const std::vector<double>& predicted_load,
                        const MigrationOptions& options) {
  if (proposals.empty()) return plan_migration(current, current, predicted_load, options);
  // The best plan carried out, else the best refused for cost (the arena's refusal only when
  // nothing else stood in the way), ranked by net benefit.
  MigrationPlan best;
  double best_net = 0;
  int best_rank = -1;
  for (const Placement& proposal : proposals) {
    MigrationPlan plan = plan_migration(current, proposal, predicted_load, options);
    const double net = plan.gain_seconds - options.min_gain_ratio * plan.seconds;
    const int rank = plan.migrate                       ? 3
                     : plan.reason == "below threshold" ? 2
                     : plan.reason == "arena"           ? 1
                                                        : 0;
    if (rank > best_rank || (rank == best_rank && net > best_net)) {
      best_rank = rank;
      best_net = net;
      best = std::move(plan);
    }
  }
  return best;
}

MigrationPlan plan_rebalance(const Placement& current, const std::vector<double>& predicted_load,
                             const MigrationOptions& options, int max_moves) {
  std::vector<Placement> proposals = incremental_moves(current, predicted_load, options, max_moves);
  proposals.push_back(align_to(place_two_level(predicted_load, current.cluster), current));
  return best_plan(current, proposals, predicted_load, options);
}

}  // namespace rlf
