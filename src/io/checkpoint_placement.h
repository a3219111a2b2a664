// What a checkpoint of an expert-parallel run keeps besides the experts' tensors so that a resume
// continues bit for bit (docs/EDPB.md "Checkpoints"): the expert placement in force (each layer's
// slot -> expert table over the EP group's slots, replicas of hot experts included) and the
// rebalancer's state (its load predictors and the accumulators of the interval since its last
// decision). With replicas the math depends on the placement (a replicated expert's tokens are
// split over its holders, their gradients summed in slot order), and the rebalancer's next
// decisions depend on its state. The tensors stay in the file by expert id (src/io/checkpoint.h),
// so a run of another EP degree or with other spare slots still resumes, at its default placement.
#pragma once

#include <string>
#include <vector>

namespace rlf {

// TrainRebalancer's state between steps (src/app/train_rebalance.h).
struct RebalancerState {
  // Every layer's LoadPredictor (Holt: level and trend per expert), [layer][expert], and the
  // steps each has observed (the same for every layer).
  std::vector<std::vector<double>> level, trend;
  int predictor_steps = 0;
  // Since the last decision: the seconds charged for the steps and the busiest EP rank's routed
  // tokens summed over layers and steps.
  double interval_seconds = 0, interval_busiest_tokens = 0;
  int migrations = 0;  // migrations so far (the run's summary counts them)

  bool operator==(const RebalancerState&) const = default;
};

struct CheckpointPlacement {
  int ep_degree = 0;       // EP ranks of the group the tables describe
  int slots_per_rank = 0;  // experts / ep_degree + spare slots
  // [layer][slot]: the expert slot `slot` holds (ep_degree x slots_per_rank per layer; EP rank r
  // holds slots [r slots_per_rank, (r + 1) slots_per_rank)).
  std::vector<std::vector<int>> slot_experts;
  bool has_rebalancer = false;  // a run with --rebalance-every saved its rebalancer's state
  RebalancerState rebalancer;

  bool operator==(const CheckpointPlacement&) const = default;
};

// "" when `placement` is consistent for a model of `layers` layers and `experts` experts: every
// table of ep_degree x slots_per_rank slots holding every expert, none twice on one EP rank, at
// least experts / ep_degree slots per rank; the rebalancer's arrays [layers][experts] of finite
// values. Otherwise what is wrong (for a message naming the file).
std::string placement_problem(const CheckpointPlacement& placement, int layers, int experts);

// Whether a run whose EP group has `ep_degree` ranks of `slots_per_rank` slots can adopt the
// saved tables (else it resumes at its default placement).
inline bool placement_fits(const CheckpointPlacement& placement, int ep_degree,
                           int slots_per_rank) {
  return placement.ep_degree == ep_degree && placement.slots_per_rank == slots_per_rank;
}

}  // namespace rlf
