// Whether to move from the current expert placement to a proposed one: the gain is the predicted
// expert time saved over the horizon (lower maximum device load), the cost is the time to send
// the experts' weights and AdamW states over the links (intra- or inter-node bandwidth, devices
// sending and receiving in parallel). Migrate only when gain > min_gain_ratio x cost, and never
// when a device's arena cannot hold what it keeps plus what it receives.
#pragma once

#include <string>
#include <vector>

#include "src/balance/expert_placement.h"

namespace rlf {

struct MigrationOptions {
  double bytes_per_expert = 0;      // one expert's weights + optimizer states (what a slot holds)
  double intra_node_bandwidth = 0;  // bytes/s of one device's link inside a node
  double inter_node_bandwidth = 0;  // bytes/s of one device's link to another node
  double arena_bytes = 0;           // per device: room for expert slots and migration receives
  double seconds_per_token = 0;     // expert time of one routed token (step ~ max device load)
  int horizon = 20;                 // steps the new placement is expected to serve (>= 1)
  double min_gain_ratio = 1.0;      // migrate when gain > this x cost (>= 0)

  // ConfigError naming the option for a value out of range.
  void validate() const;
};

struct ExpertTransfer {
  int expert = 0, from_device = 0, to_device = 0, to_slot = 0;
  bool inter_node = false;
};

struct MigrationPlan {
  Placement target;  // the proposed placement when migrating, else the current one
  std::vector<ExpertTransfer> transfers;  // of the proposal (also when it is refused)
  double intra_node_bytes = 0, inter_node_bytes = 0;
  double seconds = 0;       // modelled time of the transfers (the busiest device link)
  double gain_seconds = 0;  // predicted expert time saved over the horizon
  double peak_bytes = 0;    // largest expert memory of a device during the migration
  bool migrate = false;
  std::string reason;  // "migrate", "no change", "below threshold" or "arena"
};

// Transfers that turn `current` into `target`: every slot whose expert its device does not hold
// yet, from a device holding it now (same node first, then the least busy sender).
std::vector<ExpertTransfer> transfers_between(const Placement& current, const Placement& target);

// `predicted_load` is the expected tokens per expert and step over the horizon.
MigrationPlan plan_migration(const Placement& current, const Placement& proposed,
                             const std::vector<double>& predicted_load,
                             const MigrationOptions& options);

}  // namespace rlf
