#include "src/balance/migration_planner.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "kernels/error.h"

namespace rlf {

namespace {

void require_positive(double value, const char* option) {
  if (!(value > 0) || !std::isfinite(value)) {
    throw ConfigError(std::string(option) + " must be a positive number, got " +
                      std::to_string(value));
  }
}

}  // namespace

void MigrationOptions::validate() const {
  require_positive(bytes_per_expert, "--expert-bytes");
  require_positive(intra_node_bandwidth, "--migration-intra-bandwidth");
  require_positive(inter_node_bandwidth, "--migration-inter-bandwidth");
  require_positive(arena_bytes, "--arena-bytes");
  require_positive(seconds_per_token, "--seconds-per-token");
  if (horizon < 1) throw ConfigError("--horizon must be >= 1, got " + std::to_string(horizon));
  if (!(min_gain_ratio >= 0) || !std::isfinite(min_gain_ratio)) {
    throw ConfigError("--min-gain-ratio must be a finite number >= 0, got " +
                      std::to_string(min_gain_ratio));
  }
}

std::vector<ExpertTransfer> transfers_between(const Placement& current, const Placement& target) {
  const ExpertCluster& c = current.cluster;
  const int spd = c.slots_per_device;
  std::vector<double> send_bytes(size_t(c.devices()), 0.0);  // in units of experts
  std::vector<ExpertTransfer> out;
  for (int d = 0; d < c.devices(); ++d) {
    std::map<int, int> held;
    for (int s = 0; s < spd; ++s) ++held[current.expert_at(d, s)];
    for (int s = 0; s < spd; ++s) {
      const int e = target.expert_at(d, s);
      if (held[e] > 0) {  // already here (a local copy at most)
        --held[e];
        continue;
      }
      int from = -1;
      for (int src = 0; src < c.devices(); ++src) {
        bool holds = false;
        for (int t = 0; t < spd && !holds; ++t) holds = current.expert_at(src, t) == e;
        if (!holds) continue;
        const bool near = c.node_of(src) == c.node_of(d);
        const bool best_near = from >= 0 && c.node_of(from) == c.node_of(d);
        if (from < 0 || (near && !best_near) ||
            (near == best_near && send_bytes[size_t(src)] < send_bytes[size_t(from)])) {
          from = src;
        }
      }
      send_bytes[size_t(from)] += 1;
      out.push_back({e, from, d, s, c.node_of(from) != c.node_of(d)});
    }
  }
  return out;
}

MigrationPlan plan_migration(const Placement& current, const Placement& proposed,
                             const std::vector<double>& predicted_load,
                             const MigrationOptions& options) {
  options.validate();
  const ExpertCluster& c = current.cluster;
  if (options.arena_bytes < options.bytes_per_expert * c.slots_per_device) {
    throw ConfigError("--arena-bytes " + std::to_string(options.arena_bytes) + " cannot hold the " +
                      std::to_string(c.slots_per_device) + " expert slots of a device");
  }
  MigrationPlan plan;
  plan.target = current;
  plan.transfers = transfers_between(current, proposed);
  std::vector<double> send(size_t(c.devices()), 0.0), receive(send);
  std::vector<int> incoming(size_t(c.devices()), 0);
  for (const ExpertTransfer& t : plan.transfers) {
    const double bandwidth =
        t.inter_node ? options.inter_node_bandwidth : options.intra_node_bandwidth;
    (t.inter_node ? plan.inter_node_bytes : plan.intra_node_bytes) += options.bytes_per_expert;
    send[size_t(t.from_device)] += options.bytes_per_expert / bandwidth;
    receive[size_t(t.to_device)] += options.bytes_per_expert / bandwidth;
    ++incoming[size_t(t.to_device)];
  }
  for (int d = 0; d < c.devices(); ++d) {
    plan.seconds = std::max({plan.seconds, send[size_t(d)], receive[size_t(d)]});
    // A device keeps its old experts until they are sent and receives before it evicts.
    plan.peak_bytes = std::max(
        plan.peak_bytes, options.bytes_per_expert * (c.slots_per_device + incoming[size_t(d)]));
  }
  plan.gain_seconds = options.horizon * options.seconds_per_token *
                      (max_of(current.device_loads(predicted_load)) -
                       max_of(proposed.device_loads(predicted_load)));
  if (plan.transfers.empty()) {
    plan.reason = "no change";
  } else if (plan.peak_bytes > options.arena_bytes) {
    plan.reason = "arena";
  } else if (!(plan.gain_seconds > options.min_gain_ratio * plan.seconds)) {
    plan.reason = "below threshold";
  } else {
    plan.reason = "migrate";
    plan.migrate = true;
    plan.target = proposed;
  }
  return plan;
}

}  // namespace rlf
