#include "src/balance/eplb_baseline.h"

#include <string>

#include "kernels/error.h"
#include "src/balance/greedy_packing.h"

namespace rlf {

namespace {

// Replicate `experts` (ids and loads) over `slots` and pack the replicas evenly (same count per
// device, no care for two replicas of one expert on a device, as EPLB) onto devices
// [first_device, first_device + devices) of `p`.
void replicate_and_pack(const std::vector<int>& experts, const std::vector<double>& load, int slots,
                        int first_device, int devices, Placement& p) {
  std::vector<double> group_load;
  for (int e : experts) group_load.push_back(load[size_t(e)]);
  const std::vector<int> r = replicate_by_load(group_load, slots, slots);
  std::vector<double> weight;
  std::vector<int> expert_of;
  for (size_t i = 0; i < experts.size(); ++i) {
    for (int k = 0; k < r[i]; ++k) {
      weight.push_back(group_load[i] / r[i]);
      expert_of.push_back(experts[i]);
    }
  }
  const int spd = p.cluster.slots_per_device;
  const std::vector<int> device_of = pack_heaviest_first(weight, devices, spd);
  std::vector<int> used(size_t(devices), 0);
  for (size_t u = 0; u < weight.size(); ++u) {
    const int d = first_device + device_of[u];
    p.slot_expert[size_t(d * spd + used[size_t(device_of[u])]++)] = expert_of[u];
  }
}

}  // namespace

Placement place_eplb(const std::vector<double>& expert_load, const ExpertCluster& cluster,
                     int groups) {
  const int experts = int(expert_load.size());
  cluster.validate(experts);
  if (groups < 1 || experts % groups != 0) {
    throw ConfigError("EPLB: " + std::to_string(groups) + " expert groups do not divide " +
                      std::to_string(experts) + " experts");
  }
  Placement p{cluster, experts, std::vector<int>(size_t(cluster.slots()), -1)};
  const int per_group = experts / groups, slots_per_node = cluster.slots() / cluster.nodes;
  const bool hierarchical =
      groups % cluster.nodes == 0 && experts / cluster.nodes <= slots_per_node;
  if (!hierarchical) {
    std::vector<int> all(static_cast<size_t>(experts));
    for (int e = 0; e < experts; ++e) all[size_t(e)] = e;
    replicate_and_pack(all, expert_load, cluster.slots(), 0, cluster.devices(), p);
    return p;
  }
  std::vector<double> group_load(size_t(groups), 0.0);
  for (int e = 0; e < experts; ++e) group_load[size_t(e / per_group)] += expert_load[size_t(e)];
  const std::vector<int> node_of =
      pack_heaviest_first(group_load, cluster.nodes, groups / cluster.nodes);
  for (int node = 0; node < cluster.nodes; ++node) {
    std::vector<int> node_experts;
    for (int g = 0; g < groups; ++g) {
      if (node_of[size_t(g)] != node) continue;
      for (int e = g * per_group; e < (g + 1) * per_group; ++e) node_experts.push_back(e);
    }
    replicate_and_pack(node_experts, expert_load, slots_per_node, node * cluster.devices_per_node,
                       cluster.devices_per_node, p);
  }
  return p;
}

}  // namespace rlf
