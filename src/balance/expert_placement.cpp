#include "src/balance/expert_placement.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <queue>
#include <string>

#include "kernels/error.h"
#include "src/balance/greedy_packing.h"

namespace rlf {

void ExpertCluster::validate(int experts) const {
  if (nodes < 1 || devices_per_node < 1 || slots_per_device < 1) {
    throw ConfigError(
        "expert placement: nodes, devices per node and slots per device must be >= 1");
  }
  if (experts < 1 || slots() < experts || slots_per_device > experts) {
    throw ConfigError("expert placement: " + std::to_string(experts) + " experts do not fit in " +
                      std::to_string(devices()) + " devices x " + std::to_string(slots_per_device) +
                      " slots (or a device has more slots than there are experts)");
  }
}

std::vector<int> Placement::replicas() const {
  std::vector<int> count(size_t(experts), 0);
  for (int e : slot_expert) ++count[size_t(e)];
  return count;
}

std::vector<double> Placement::device_loads(const std::vector<double>& expert_load) const {
  const std::vector<int> r = replicas();
  std::vector<double> load(size_t(cluster.devices()), 0.0);
  for (int d = 0; d < cluster.devices(); ++d) {
    for (int s = 0; s < cluster.slots_per_device; ++s) {
      const int e = expert_at(d, s);
      load[size_t(d)] += expert_load[size_t(e)] / r[size_t(e)];
    }
  }
  return load;
}

bool Placement::valid() const {
  if (int(slot_expert.size()) != cluster.slots()) return false;
  for (int e : slot_expert) {
    if (e < 0 || e >= experts) return false;
  }
  const std::vector<int> r = replicas();
  return std::all_of(r.begin(), r.end(), [](int c) { return c >= 1; });
}

bool Placement::one_copy_per_device() const {
  const size_t per_device = size_t(cluster.slots_per_device);
  for (size_t first = 0; first + per_device <= slot_expert.size(); first += per_device) {
    std::vector<int> held(slot_expert.begin() + ptrdiff_t(first),
                          slot_expert.begin() + ptrdiff_t(first + per_device));
    std::sort(held.begin(), held.end());
    if (std::adjacent_find(held.begin(), held.end()) != held.end()) return false;
  }
  return true;
}

double max_of(const std::vector<double>& values) {
  return values.empty() ? 0.0 : *std::max_element(values.begin(), values.end());
}

double mean_of(const std::vector<double>& values) {
  return values.empty()
             ? 0.0
             : std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
}

Placement round_robin_placement(const ExpertCluster& cluster, int experts) {
  cluster.validate(experts);
  Placement p{cluster, experts, std::vector<int>(size_t(cluster.slots()))};
  // Experts in device-major order with the spares last on each device: device d holds the d-th
  // contiguous block of experts, then spare copies.
  const int per_device = (experts + cluster.devices() - 1) / cluster.devices();
  int spare = 0;
  for (int d = 0; d < cluster.devices(); ++d) {
    for (int s = 0; s < cluster.slots_per_device; ++s) {
      const int e = d * per_device + s;
      const bool own = s < per_device && e < experts;
      p.slot_expert[size_t(d * cluster.slots_per_device + s)] = own ? e : spare++ % experts;
    }
  }
  return p;
}

std::vector<int> replicate_by_load(const std::vector<double>& expert_load, int slots,
                                   int max_replicas) {
  const int experts = int(expert_load.size());
  std::vector<int> r(size_t(experts), 1);
  // Largest load per replica first; equal ones by the lower expert id.
  auto before = [&](int a, int b) {
    const double la = expert_load[size_t(a)] / r[size_t(a)],
                 lb = expert_load[size_t(b)] / r[size_t(b)];
    return la != lb ? la < lb : a > b;
  };
  std::priority_queue<int, std::vector<int>, decltype(before)> heap(before);
  for (int e = 0; e < experts; ++e) heap.push(e);
  for (int spare = slots - experts; spare > 0 && !heap.empty();) {
    const int e = heap.top();
    heap.pop();
    if (r[size_t(e)] >= max_replicas) continue;
    ++r[size_t(e)];
    --spare;
    heap.push(e);
  }
  return r;
}

Placement place_two_level(const std::vector<double>& expert_load, const ExpertCluster& cluster) {
  const int experts = int(expert_load.size());
  cluster.validate(experts);
  const std::vector<int> r = replicate_by_load(expert_load, cluster.slots(), cluster.devices());
  std::vector<double> weight;
  std::vector<int> expert_of;
  for (int e = 0; e < experts; ++e) {
    for (int k = 0; k < r[size_t(e)]; ++k) {
      weight.push_back(expert_load[size_t(e)] / r[size_t(e)]);
      expert_of.push_back(e);
    }
  }
  // validate() keeps slots_per_device <= experts, so the capped replicas still fill every slot.
  const std::vector<int> node_of = pack_heaviest_first(
      weight, cluster.nodes, cluster.devices_per_node * cluster.slots_per_device, expert_of,
      cluster.devices_per_node);
  Placement p{cluster, experts, std::vector<int>(size_t(cluster.slots()), -1)};
  for (int node = 0; node < cluster.nodes; ++node) {
    std::vector<double> node_weight;
    std::vector<int> node_expert;
    for (size_t u = 0; u < weight.size(); ++u) {
      if (node_of[u] != node) continue;
      node_weight.push_back(weight[u]);
      node_expert.push_back(expert_of[u]);
    }
    const std::vector<int> device_of = pack_heaviest_first(node_weight, cluster.devices_per_node,
                                                           cluster.slots_per_device, node_expert);
    std::vector<int> used(size_t(cluster.devices_per_node), 0);
    for (size_t u = 0; u < node_weight.size(); ++u) {
      const int d = node * cluster.devices_per_node + device_of[u];
      p.slot_expert[size_t(d * cluster.slots_per_device + used[size_t(device_of[u])]++)] =
          node_expert[u];
    }
  }
  return p;
}

namespace {

// Pairs (a, b) of [0, n) x [0, n), one per a and per b, taken greedily by the largest overlap.
std::vector<int> match_by_overlap(const std::vector<std::vector<int>>& overlap) {
  const int n = int(overlap.size());
  std::vector<int> match(size_t(n), -1);
  std::vector<bool> taken(size_t(n), false);
  for (int round = 0; round < n; ++round) {
    int best_a = -1, best_b = -1;
    for (int a = 0; a < n; ++a) {
      if (match[size_t(a)] >= 0) continue;
      for (int b = 0; b < n; ++b) {
        if (taken[size_t(b)]) continue;
        if (best_a < 0 || overlap[size_t(a)][size_t(b)] > overlap[size_t(best_a)][size_t(best_b)]) {
          best_a = a;
          best_b = b;
        }
      }
    }
    match[size_t(best_a)] = best_b;
    taken[size_t(best_b)] = true;
  }
  return match;
}

std::map<int, int> expert_counts(const Placement& p, int first_device, int devices) {
  std::map<int, int> count;
  for (int d = first_device; d < first_device + devices; ++d) {
    for (int s = 0; s < p.cluster.slots_per_device; ++s) ++count[p.expert_at(d, s)];
  }
  return count;
}

int common(const std::map<int, int>& a, const std::map<int, int>& b) {
  int n = 0;
  for (const auto& [e, c] : a) {
    const auto it = b.find(e);
    if (it != b.end()) n += std::min(c, it->second);
  }
  return n;
}

}  // namespace

Placement align_to(const Placement& fresh, const Placement& current) {
  const ExpertCluster& c = fresh.cluster;
  const int dpn = c.devices_per_node, spd = c.slots_per_device;
  std::vector<std::vector<int>> node_overlap(size_t(c.nodes), std::vector<int>(size_t(c.nodes)));
  for (int a = 0; a < c.nodes; ++a) {
    for (int b = 0; b < c.nodes; ++b) {
      node_overlap[size_t(a)][size_t(b)] =
          common(expert_counts(fresh, a * dpn, dpn), expert_counts(current, b * dpn, dpn));
    }
  }
  const std::vector<int> node_match = match_by_overlap(node_overlap);
  Placement out{c, fresh.experts, std::vector<int>(size_t(c.slots()), -1)};
  for (int a = 0; a < c.nodes; ++a) {
    const int b = node_match[size_t(a)];
    std::vector<std::vector<int>> device_overlap(static_cast<size_t>(dpn),
                                                 std::vector<int>(size_t(dpn)));
    for (int i = 0; i < dpn; ++i) {
      for (int j = 0; j < dpn; ++j) {
        device_overlap[size_t(i)][size_t(j)] =
            common(expert_counts(fresh, a * dpn + i, 1), expert_counts(current, b * dpn + j, 1));
      }
    }
    const std::vector<int> device_match = match_by_overlap(device_overlap);
    for (int i = 0; i < dpn; ++i) {
      const int from = a * dpn + i, to = b * dpn + device_match[size_t(i)];
      int* slots = out.slot_expert.data() + size_t(to) * spd;
      std::vector<int> incoming;
      // An expert the device already holds keeps its slot; the others take the freed slots.
      for (int s = 0; s < spd; ++s) {
        const int e = fresh.expert_at(from, s);
        int keep = -1;
        for (int t = 0; t < spd && keep < 0; ++t) {
          if (slots[t] < 0 && current.expert_at(to, t) == e) keep = t;
        }
        if (keep >= 0) {
          slots[keep] = e;
        } else {
          incoming.push_back(e);
        }
      }
      for (int s = 0, k = 0; s < spd; ++s) {
        if (slots[s] < 0) slots[s] = incoming[size_t(k++)];
      }
    }
  }
  return out;
}

}  // namespace rlf
