// The planner's search: every strategy of a space (modes, staleness bounds, training TP/PP/VPP/EP,
// generation TP/EP, the disaggregated split of the devices, offload, EP overlap and dispatch,
// recompute, EDPB's redundant experts) on
// a fixed number of devices, evaluated in parallel with oneTBB, the best that fit in device
// memory kept in rank order. Decoding and evaluating a strategy allocate nothing.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "src/sim/cost_model.h"

namespace rlf::sim {

struct SearchSpace {
  int devices = 0;
  std::vector<Mode> modes{Mode::Disaggregated, Mode::Fused, Mode::FusedAll};
  std::vector<int> staleness{0, 1};
  int max_tp = 0;   // 0: devices per node
  int max_pp = 64;  // pipeline stages, powers of two
  int max_vpp = 4;  // virtual stages per device, powers of two
  // EDPB's expert rebalancing, with 0 .. max_redundant_experts spare expert slots per training EP
  // rank (strategies without it are searched too; with a uniform router, only those).
  bool rebalance = true;
  int max_redundant_experts = 2;
  // Fused strategies generating inside the training pipelines (each stage from its own layers)
  // beside those generating at PP 1.
  bool generation_inside_pipelines = true;
};

inline constexpr int kKeepBest = 10;

struct Ranked {
  Strategy strategy;
  Prediction prediction;
};

struct SearchResult {
  int64_t evaluated = 0;  // index points of the space decoded and checked
  int64_t feasible =
      0;                // layouts the model and job can run, each predicted (the rate counts these)
  int64_t fitting = 0;  // feasible and within device memory
  double seconds = 0;
  std::vector<Ranked> best;  // highest tokens/s first, at most kKeepBest
  // Strategies predicted per second.
  double rate() const { return seconds > 0 ? double(feasible) / seconds : 0; }
};

SearchResult search(const ModelShape& model, const ModelConfig& config,
                    const ClusterConfig& cluster, const RlJob& job, const SearchSpace& space);

}  // namespace rlf::sim
