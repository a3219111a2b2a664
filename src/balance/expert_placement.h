// Where the experts of one MoE layer live: every device has the same number of expert slots
// (one expert's weights and optimizer states each), devices are grouped into nodes, and a hot
// expert may occupy several slots (replicas) that share its tokens evenly. Our two-level placement
// replicates by load, packs the replicas into nodes and then into the devices of each node.
#pragma once

#include <cstddef>
#include <vector>

namespace rlf {

struct ExpertCluster {
  int nodes = 1, devices_per_node = 1, slots_per_device = 1;

  int devices() const { return nodes * devices_per_node; }
  int slots() const { return devices() * slots_per_device; }
  int node_of(int device) const { return device / devices_per_node; }
  // ConfigError unless every count is >= 1, the slots can hold `experts` (>= 1) experts and no
  // device has more slots than there are experts (a replica per device is the most useful).
  void validate(int experts) const;
};

struct Placement {
  ExpertCluster cluster;
  int experts = 0;
  std::vector<int> slot_expert;  // [device * slots_per_device + slot] -> expert

  int expert_at(int device, int slot) const {
    return slot_expert[size_t(device * cluster.slots_per_device + slot)];
  }
  // Slots each expert occupies (>= 1 for a valid placement).
  std::vector<int> replicas() const;
  // Device loads when each expert's load is split evenly over its replicas.
  std::vector<double> device_loads(const std::vector<double>& expert_load) const;
  // Every expert has a slot and every slot an expert in [0, experts).
  bool valid() const;
  // No device holds an expert twice: a second copy on one device adds no capacity (the EP
  // dispatcher refuses such a table).
  bool one_copy_per_device() const;
};

double max_of(const std::vector<double>& values);
double mean_of(const std::vector<double>& values);

// The starting layout before any statistics: expert e in slot e of the slot sequence, the spare
// slots holding experts 0, 1, ... again (device-major, so each device gets a contiguous block).
Placement round_robin_placement(const ExpertCluster& cluster, int experts);

// Replica counts that minimize the largest load per replica: every expert gets one slot and each
// of the `slots - experts` spare slots goes to the expert with the largest load / replicas
// (never more replicas than `max_replicas`).
std::vector<int> replicate_by_load(const std::vector<double>& expert_load, int slots,
                                   int max_replicas);

// Ours: replicate over all slots, pack the replicas (weight load / replicas) heaviest first into
// nodes (capacity = the node's slots), then inside each node into its devices, keeping replicas
// of one expert on different devices.
Placement place_two_level(const std::vector<double>& expert_load, const ExpertCluster& cluster);

// The same placement renumbered to move as little as possible from `current`: nodes, and then
// devices inside each node, are matched greedily by the most experts in common, and an expert a
// device keeps stays in its slot. Loads per device are unchanged (only labels move).
Placement align_to(const Placement& fresh, const Placement& current);

}  // namespace rlf
