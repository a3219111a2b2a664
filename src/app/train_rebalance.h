// EDPB inside an expert-parallel `train` (docs/EDPB.md "Rebalancing in train"): every learner
// records its router statistics per step into the trace, and with --rebalance-every K the
// learners feed the loads summed over all of them to one load predictor per layer every step
// and, every K steps, let the migration planner decide for each layer whether moving its experts
// between the EP ranks pays off over the horizon; if so the experts move live, rank to rank, with
// their AdamW moments (and the frozen reference's weights). Every decision is the same on every
// learner (the same summed loads, pure functions), so the DP replicas keep one placement.
// By default (--rebalance-rates counted) the decisions are reproducible: the planner charges
// transfers and routed tokens at fixed rates (a cluster file's, or the documented constants
// below) applied to counted bytes, FLOPs and router loads, so two runs with one seed migrate alike
// and a resumed run (its rebalancer's state is in the checkpoint) decides as the uninterrupted one.
// `measured` charges the link rate timed at start and the steps' wall time instead (not
// reproducible).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mpi_comm/topology.h"
#include "src/app/options.h"
#include "src/balance/load_predictor.h"
#include "src/balance/migration_planner.h"
#include "src/io/checkpoint_placement.h"
#include "src/io/trace.h"
#include "src/model/optimizer.h"
#include "src/model/tensor_parallel.h"
#include "src/model/transformer.h"
#include "src/runtime/role_expert_parallel.h"

namespace rlf {

struct RebalanceOptions {
  int every = 0;                // --rebalance-every: steps between decisions (0: off)
  int horizon = 20;             // --rebalance-horizon: steps a new placement should serve
  double min_gain_ratio = 2.0;  // --rebalance-min-gain: migrate when gain > this x cost
  double smoothing = 0.3;       // --rebalance-smoothing: EMA weight of the newest step's loads
  float router_skew = 0.0f;     // --router-skew (src/model/router_skew.h; 0: off)
  // --redundant-experts: spare expert slots per training EP rank for replicas of hot experts
  // (disaggregated or fused, any --ep-overlap-chunks, no checkpoints; 0 <= R <= E - E / EP,
  // checked where the experts are known).
  int redundant_experts = 0;
  // --rebalance-rates: "counted" (fixed rates: reproducible) or "measured" (timed: not).
  std::string rates = "counted";
  // --rebalance-cluster: a cluster file (src/sim/cluster.h, e.g. from `rlfusion bench calibrate`)
  // whose compute rate and links (inside a node: the level a node's EP ranks span; between nodes:
  // the level the EP group spans) the counted rates take; "": the default rates.
  std::string cluster;
};

// Counted rates without a cluster file: a CPU rank's sustained matmul rate and a shared-memory
// MPI link, rounded (docs/EDPB.md "Reproducible decisions").
inline constexpr double kDefaultRebalanceFlops = 20e9;         // FLOP/s per EP rank
inline constexpr double kDefaultRebalanceLinkBandwidth = 2e9;  // bytes/s per EP rank

// The rates counted decisions charge: FLOP/s per EP rank and the links between EP ranks in
// bytes/s, inside a node and between nodes (before link emulation's delays).
struct RebalanceRates {
  double flops = kDefaultRebalanceFlops;
  double intra_node_bandwidth = kDefaultRebalanceLinkBandwidth;
  double inter_node_bandwidth = kDefaultRebalanceLinkBandwidth;
};
// From --rebalance-cluster (inside a node: the link of the level `ranks_per_node` consecutive
// ranks span; between nodes: the level `ep_degree` consecutive ranks span), else the defaults.
// ConfigError naming the file when it cannot be read or is invalid.
RebalanceRates counted_rebalance_rates(const RebalanceOptions& options, int ep_degree,
                                       int ranks_per_node);

// The EP group as the planner's cluster (device = EP rank, `slots_per_rank` slots each): its
// nodes (real, or virtual with --ranks-per-node) when every node holds the same number of
// consecutive EP ranks, so that place_two_level keeps hot experts' replicas and moves inside
// nodes; else one node.
ExpertCluster ep_cluster(const HierarchicalComm& ep_group, int slots_per_rank);

po::options_description rebalance_options_description(RebalanceOptions& options);
// ConfigError naming the option for a value out of range, or for --rebalance-every or
// --redundant-experts without experts to move (learner EP degree < 2), an unknown
// --rebalance-rates, or a --rebalance-cluster file that cannot be read or is invalid (or given
// with measured rates).
void validate(const RebalanceOptions& options, int learner_expert_parallel);
// A log line naming the router skew ("" when off); the JSON fragment
// `"router_skew":S,"rebalance_every":K,"redundant_experts":R,` (always).
std::string describe_router_skew(const RebalanceOptions& options);
std::string router_skew_json(const RebalanceOptions& options);

class TrainRebalancer {
 public:
  // A layer's (token, expert) assignments on this rank since the last call, [expert].
  using LayerExpertTokens = std::function<std::vector<int64_t>(int layer)>;

  // Collective over `learners` (all learner ranks; with every > 0 and measured rates it times a
  // transfer of one expert's bytes between the EP ranks: the link rate migration costs are
  // charged at).
  // `reference` may be null. Everything referenced must outlive the rebalancer.
  // `expert_tokens`: where the router statistics come from (default: the model's dispatchers and
  // overlap chunks). With pipeline stages (a layer-sharded `model`, its EP group over the stage's
  // ranks, `learners` every stage's ranks) only the layers the stage stores are recorded; every
  // rank decides every layer's placement on the loads summed over all of them, and each EP group
  // moves the experts of its own layers while its dispatchers follow every layer's table.
  TrainRebalancer(const RebalanceOptions& options, RoleExpertParallel& ep,
                  const HierarchicalComm& learners, Transformer<float>& model,
                  AdamW<float>& optimizer, Transformer<float>* reference, TraceRecorder& trace,
                  LayerExpertTokens expert_tokens = {});

  // After RL step `step`, which took `step_seconds` on this rank (only measured rates use it;
  // collective over the learners when rebalancing): records the step's router statistics; every
  // `every` steps decides and maybe migrates. Returns a log line for a migration, else "".
  std::string end_of_step(int step, double step_seconds);

  // Fused mode with a generation layout of its own (`generation`: its EP group, no replicas):
  // after a decision step (the steps end_of_step decides at), places every layer's experts for
  // generation from the same predicted loads (place_two_level on the generation group's nodes,
  // renumbered to keep experts at their default slots where it can; a layer keeps the default
  // placement unless that lowers its busiest generation EP rank) and gives `generation` the
  // tables (its dispatchers route by them; the layout switch follows them). Generation computes
  // the same rows either way, only on other ranks. Returns a log line with the predicted max/mean
  // generation EP-rank load before and after ("" when no decision was due).
  std::string place_generation(int step, RoleExpertParallel& generation) const;

  int migrations() const { return migrations_; }
  bool rebalancing() const { return options_.every > 0; }
  // The predictors and interval accumulators, for checkpoints; restore() continues from them
  // (the placement itself lives in the RoleExpertParallel). ConfigError for a state of another
  // model shape.
  RebalancerState state() const;
  void restore(const RebalancerState& state);
  // The cluster the planner places on (the EP group's nodes, ep_cluster) and the options it plans
  // a layer's migration with at the next decision (its rates, arena, horizon and threshold).
  const ExpertCluster& cluster() const { return cluster_; }
  MigrationOptions migration_options() const;
  // "# rebalancing: ..." describing the settings, for the run's log ("" when off).
  std::string describe() const;

 private:
  // This step's tokens per layer and expert, [layer][expert] (also recorded in the trace).
  std::vector<std::vector<double>> take_router_loads(int step);
  // Bytes/s of a ring transfer of one expert over `group` (collective over it, then the minimum
  // over the learners).
  double measure_link_rate(MPI_Comm group) const;
  // Seconds the step spends per routed token of the busiest EP rank, per layer.
  double seconds_per_token() const;

  RebalanceOptions options_;
  RoleExpertParallel& ep_;
  const HierarchicalComm& learners_;
  Transformer<float>& model_;
  AdamW<float>& optimizer_;
  Transformer<float>* reference_;
  TraceRecorder& trace_;
  LayerExpertTokens expert_tokens_;
  ExpertCluster cluster_;
  std::vector<LoadPredictor> predictors_;  // one per layer
  // One expert of one layer: its weights + AdamW moments (+ reference weights).
  double bytes_per_expert_ = 0, expert_share_ = 0, arena_bytes_ = 0;
  // Bytes/s a migration is charged inside a node and between nodes (with link emulation, the
  // inter-node rate includes its delay).
  double intra_link_rate_ = 0, inter_link_rate_ = 0;
  bool measured_ = false;  // --rebalance-rates measured
  // Counted rates: FLOPs one routed token costs one expert of one layer in a training step
  // (forward and backward of its three matrices) and the FLOP/s they run at.
  double flops_per_routed_token_ = 0, flops_ = 0;
  // Since the last decision: the slowest learner's step seconds and the busiest EP rank's tokens
  // summed over layers (each layer's exchange waits for its busiest rank).
  double interval_seconds_ = 0, interval_busiest_tokens_ = 0;
  int migrations_ = 0;
};

// TP x EP without the token split (--tensor-parallel-duplicate-experts): every rank of a TP group
// dispatches the group's tokens, so only TP rank 0 counts them; on the other TP ranks the
// rebalancer's expert_tokens take the dispatchers' counts and return zeros. Empty (count every
// dispatcher's tokens) otherwise: without TP, or with the split (each TP rank counts its share).
TrainRebalancer::LayerExpertTokens tensor_parallel_expert_tokens(Transformer<float>& model,
                                                                 const TensorParallel* tp,
                                                                 bool expert_token_split);

}  // namespace rlf
