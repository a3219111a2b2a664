#include "src/io/checkpoint_placement.h"

#include <cmath>
#include <cstdint>

namespace rlf {

namespace {

std::string table_problem(const std::vector<int>& table, int ep_degree, int slots_per_rank,
                          int experts) {
  if (int64_t(table.size()) != int64_t(ep_degree) * slots_per_rank) {
    return "a slot table has " + std::to_string(table.size()) + " slots, not " +
           std::to_string(int64_t(ep_degree) * slots_per_rank);
  }
  std::vector<int> held(size_t(experts), 0);
  for (size_t s = 0; s < table.size(); ++s) {
    const int e = table[s];
    if (e < 0 || e >= experts) return "a slot holds expert " + std::to_string(e);
    ++held[size_t(e)];
    const size_t rank_start = s / size_t(slots_per_rank) * size_t(slots_per_rank);
    for (size_t t = rank_start; t < s; ++t) {
      if (table[t] == e) return "an EP rank holds expert " + std::to_string(e) + " twice";
    }
  }
  for (int e = 0; e < experts; ++e) {
    if (held[size_t(e)] == 0) return "expert " + std::to_string(e) + " has no slot";
  }
  return "";
}

std::string array_problem(const std::vector<std::vector<double>>& values, int layers, int experts,
                          const char* name) {
  if (int(values.size()) != layers)
    return std::string("the rebalancer's ") + name + " has " + std::to_string(values.size()) +
           " layers";
  for (const std::vector<double>& layer : values) {
    if (int(layer.size()) != experts) {
      return std::string("the rebalancer's ") + name + " has " + std::to_string(layer.size()) +
             " experts in a layer";
    }
    for (double x : layer) {
      if (!std::isfinite(x)) return std::string("the rebalancer's ") + name + " is not finite";
    }
  }
  return "";
}

}  // namespace

std::string placement_problem(const CheckpointPlacement& p, int layers, int experts) {
  if (p.ep_degree < 1 || experts % p.ep_degree != 0 || p.slots_per_rank < experts / p.ep_degree) {
    return "EP degree " + std::to_string(p.ep_degree) + " with " +
           std::to_string(p.slots_per_rank) + " slots per rank does not fit " +
           std::to_string(experts) + " experts";
  }
  if (int(p.slot_experts.size()) != layers) {
    return std::to_string(p.slot_experts.size()) + " slot tables for " + std::to_string(layers) +
           " layers";
  }
  for (const std::vector<int>& table : p.slot_experts) {
    const std::string problem = table_problem(table, p.ep_degree, p.slots_per_rank, experts);
    if (!problem.empty()) return problem;
  }
  if (!p.has_rebalancer) return "";
  const RebalancerState& r = p.rebalancer;
  for (const std::string& problem : {array_problem(r.level, layers, experts, "level"),
                                     array_problem(r.trend, layers, experts, "trend")}) {
    if (!problem.empty()) return problem;
  }
  if (r.predictor_steps < 0 || r.migrations < 0 || !std::isfinite(r.interval_seconds) ||
      !std::isfinite(r.interval_busiest_tokens) || r.interval_seconds < 0 ||
      r.interval_busiest_tokens < 0) {
    return "the rebalancer's counters are out of range";
  }
  return "";
}

}  // namespace rlf
