#include "src/io/router_summary.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

namespace rlf {

std::vector<LayerImbalance> layer_imbalance(const TraceData& trace) {
  // tokens[layer][step][expert], summed over ranks.
  std::map<int, std::map<int, std::map<int, int64_t>>> tokens;
  int experts = 0;
  for (const std::vector<RouterLoad>& rank : trace.router_loads) {
    for (const RouterLoad& l : rank) {
      tokens[l.layer][l.step][l.expert] += l.tokens;
      experts = std::max(experts, l.expert + 1);
    }
  }
  std::vector<LayerImbalance> layers;
  for (const auto& [layer, steps] : tokens) {
    LayerImbalance out;
    out.layer = layer;
    std::vector<int64_t> per_expert(size_t(experts), 0);
    double sum_ratio = 0;
    for (const auto& [step, counts] : steps) {
      int64_t total = 0, most = 0;
      for (const auto& [expert, count] : counts) {
        total += count;
        most = std::max(most, count);
        per_expert[size_t(expert)] += count;
      }
      if (total == 0) continue;
      const double ratio = double(most) * experts / double(total);
      sum_ratio += ratio;
      out.worst_max_over_mean = std::max(out.worst_max_over_mean, ratio);
      out.tokens += total;
      ++out.steps;
    }
    out.mean_max_over_mean = out.steps > 0 ? sum_ratio / out.steps : 0.0;
    const auto hottest = std::max_element(per_expert.begin(), per_expert.end());
    out.hottest_expert = int(hottest - per_expert.begin());
    out.hottest_share = out.tokens > 0 ? double(*hottest) / double(out.tokens) : 0.0;
    layers.push_back(out);
  }
  return layers;
}

double router_max_over_mean(const std::vector<LayerImbalance>& layers) {
  if (layers.empty()) return 0;
  double sum = 0;
  for (const LayerImbalance& l : layers) sum += l.mean_max_over_mean;
  return sum / double(layers.size());
}

std::vector<int> router_layers(const TraceData& trace) {
  std::set<int> layers;
  for (const std::vector<RouterLoad>& rank : trace.router_loads) {
    for (const RouterLoad& l : rank) layers.insert(l.layer);
  }
  return {layers.begin(), layers.end()};
}

std::vector<std::vector<double>> layer_routing(const TraceData& trace, int layer) {
  int experts = 0;
  std::map<int, std::map<int, int64_t>> tokens;  // [step][expert], summed over ranks
  for (const std::vector<RouterLoad>& rank : trace.router_loads) {
    for (const RouterLoad& l : rank) {
      experts = std::max(experts, l.expert + 1);
      if (l.layer == layer) tokens[l.step][l.expert] += l.tokens;
    }
  }
  std::vector<std::vector<double>> steps;
  for (const auto& [step, counts] : tokens) {
    std::vector<double> row(size_t(experts), 0.0);
    for (const auto& [expert, count] : counts) row[size_t(expert)] = double(count);
    steps.push_back(std::move(row));
  }
  return steps;
}

std::vector<ExpertMigration> migrations_of(const TraceData& trace) {
  std::map<int, ExpertMigration> by_step;
  for (const std::vector<ExpertMigration>& rank : trace.migrations) {
    for (const ExpertMigration& m : rank) {
      const auto [at, fresh] = by_step.emplace(m.step, m);
      if (!fresh) at->second.bytes += m.bytes;
    }
  }
  std::vector<ExpertMigration> all;
  for (const auto& [step, m] : by_step) all.push_back(m);
  return all;
}

double expert_moves_per_step(const TraceData& trace) {
  std::set<int> layers;
  int experts = 0, last_step = 0;
  for (const std::vector<RouterLoad>& rank : trace.router_loads) {
    for (const RouterLoad& l : rank) {
      layers.insert(l.layer);
      experts = std::max(experts, l.expert + 1);
      last_step = std::max(last_step, l.step);
    }
  }
  const std::vector<ExpertMigration> migrations = migrations_of(trace);
  if (migrations.empty() || layers.empty()) return 0;
  const int steps = last_step - migrations.front().step;
  if (steps <= 0) return 0;
  double moved = 0;
  for (size_t i = 1; i < migrations.size(); ++i) moved += migrations[i].experts_moved;
  return moved / (double(layers.size()) * experts * steps);
}

}  // namespace rlf
