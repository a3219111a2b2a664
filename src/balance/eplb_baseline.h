// The baseline: DeepSeek's EPLB hierarchical policy, written from its published description
// (github.com/deepseek-ai/EPLB, README): pack expert groups evenly onto nodes balancing their
// loads, replicate experts inside each node by load per replica, then pack the replicas evenly onto
// the node's devices. When the nodes do not divide the groups it falls back to its global policy
// (replicate over all slots, pack onto all devices). It predicts nothing and knows no migration
// cost: it is given the mean load of a recent window and its result replaces the old placement.
#pragma once

#include <vector>

#include "src/balance/expert_placement.h"

namespace rlf {

// `groups` must divide the experts (consecutive ids form a group, as in group-limited routing).
// ConfigError for a bad cluster or group count.
Placement place_eplb(const std::vector<double>& expert_load, const ExpertCluster& cluster,
                     int groups);

}  // namespace rlf
