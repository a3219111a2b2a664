// One deployment strategy the planner evaluates: the RL mode, the training layout (TP, PP, VPP,
// EP, DP), the generation layout (TP, EP, DP; generation runs without pipeline stages), the
// staleness bound, and the switches that change costs (offload, EP overlap, EP dispatch).
#pragma once

#include <string>

namespace rlf::sim {

enum class Mode { Disaggregated = 0, Fused = 1, FusedAll = 2 };
const char* mode_name(Mode mode);
// ConfigError naming `option` unless `name` is disaggregated, fused or fused-all.
Mode parse_mode(const std::string& name, const std::string& option);

// Expert rows per (token, slot) (flat) or per (token, owner rank) (de-duplicated).
enum class Dispatch { Flat = 0, Dedup = 1 };

struct Parallelism {
  int tp = 1, pp = 1, vpp = 1, ep = 1, dp = 1;
  int devices() const { return tp * pp * dp; }
};

struct Strategy {
  Mode mode = Mode::Fused;
  Parallelism train;
  // pp = vpp = 1, or the training's: generation inside the training pipelines (fused)
  Parallelism generate;
  int staleness = 0;
  bool offload = true;      // fused: gradients and optimizer states to host during generation
  bool ep_overlap = false;  // EP communication overlapped with the expert compute (Adaptive Pipe)
  bool recompute = false;   // training keeps only each layer's input, recomputing the forward
  Dispatch dispatch = Dispatch::Flat;
  // EDPB's expert rebalancing (`train --rebalance-every N`, training EP > 1): experts migrate
  // between the EP ranks so that hot ones share a rank with cold ones (fused mode places its
  // generation layout the same way; disaggregated actors keep the contiguous blocks).
  bool rebalance = false;
  // Spare expert slots per training EP rank, filled and moved by EDPB (`train --redundant-experts R
  // --rebalance-every N`, so only with `rebalance`): replicas of hot experts share their tokens,
  // so the busiest rank waits less, at R more experts' weights, gradients and optimizer states per
  // rank. 0 without EP.
  int redundant_experts = 0;

  int devices() const {
    return mode == Mode::Disaggregated ? train.devices() + generate.devices() : train.devices();
  }
  // "fused train t2p4v2e8d4 gen t8e32d16 s1 offload r1", the planner's one-line name ("rebalance"
  // for EDPB without spare slots, "r1" with one).
  std::string describe() const;
};

}  // namespace rlf::sim
