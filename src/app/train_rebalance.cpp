#include "src/app/train_rebalance.h"

#include <mpi.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "kernels/arena.h"
#include "kernels/error.h"
#include "src/balance/incremental_rebalance.h"
#include "src/model/expert_parallel.h"
#include "src/model/overlapped_experts.h"
#include "src/sim/cluster.h"

namespace rlf {

namespace {

// Bytes of one routed expert of one layer: its slices of every buffer that migrates.
double expert_bytes(const ParameterLayout& layout, int buffers) {
  return double(ranges_size(expert_slices(layout, layout.first_expert(), 1, 0))) * sizeof(float) *
         buffers;
}

Placement placement_of(const std::vector<int>& slot_expert, int experts,
                       const ExpertCluster& cluster) {
  Placement p;
  p.cluster = cluster;
  p.experts = experts;
  p.slot_expert = slot_expert;
  return p;
}

// (expert, EP rank) pairs of `after` that `before` lacks: each is one expert's bytes received by
// a rank (a move, or a new replica).
int experts_received(const std::vector<int>& before, const std::vector<int>& after,
                     int slots_per_rank, int experts) {
  auto held = [&](const std::vector<int>& table) {
    std::vector<std::vector<bool>> on(size_t(experts),
                                      std::vector<bool>(table.size() / size_t(slots_per_rank)));
    for (size_t s = 0; s < table.size(); ++s)
      on[size_t(table[s])][s / size_t(slots_per_rank)] = true;
    return on;
  };
  const auto was = held(before), is = held(after);
  int received = 0;
  for (size_t e = 0; e < is.size(); ++e)
    for (size_t r = 0; r < is[e].size(); ++r) received += is[e][r] && !was[e][r];
  return received;
}

}  // namespace

po::options_description rebalance_options_description(RebalanceOptions& o) {
  po::options_description d("Expert load balancing (EDPB, docs/EDPB.md)");
  auto add = d.add_options();
  add("rebalance-every", po::value(&o.every)->default_value(o.every),
      "with --expert-parallel >= 2: every this many RL steps, predict the expert loads from the "
      "router statistics and move experts between the learners' EP ranks when the predicted "
      "gain beats the transfer cost (0: off)");
  add("rebalance-horizon", po::value(&o.horizon)->default_value(o.horizon),
      "steps a new expert placement is expected to serve (the gain is counted over them)");
  add("rebalance-min-gain", po::value(&o.min_gain_ratio)->default_value(o.min_gain_ratio),
      "migrate only when the predicted gain over the horizon exceeds this many times the "
      "transfer time at the link rate (see --rebalance-rates)");
  add("rebalance-smoothing", po::value(&o.smoothing)->default_value(o.smoothing),
      "weight of the newest step in the expert loads' moving average, in (0, 1]");
  add("router-skew", po::value(&o.router_skew)->default_value(o.router_skew),
      "experiments: add -S x expert / (experts - 1) to every router's logits, so that the "
      "low-numbered experts (EP rank 0's at the start) get most tokens; changes the model; 0: "
      "off");
  add("redundant-experts", po::value(&o.redundant_experts)->default_value(o.redundant_experts),
      "with --expert-parallel >= 2 (disaggregated mode): this many spare expert slots per learner "
      "EP rank, holding replicas of hot experts that split their tokens (placed by "
      "--rebalance-every; at most experts - experts / EP)");
  add("rebalance-rates", po::value(&o.rates)->default_value(o.rates),
      "what the rebalancer charges transfers and routed tokens at: counted (fixed rates applied "
      "to counted bytes, FLOPs and router loads: two runs with one seed, and a resumed run, "
      "migrate alike) or measured (the link timed at start, the steps' wall time: decisions vary "
      "from run to run, not reproducible)");
  add("rebalance-cluster", po::value(&o.cluster),
      "with counted rates: a cluster file (e.g. from `rlfusion bench calibrate`) whose "
      "matmul_flops and link bandwidths (inside a node: the level a node's EP ranks span; between "
      "nodes: the level the EP group spans) the rebalancer charges; default: 20 GFLOP/s per EP "
      "rank and a 2 GB/s link");
  return d;
}

void validate(const RebalanceOptions& o, int learner_expert_parallel) {
  if (o.every < 0) {
    throw ConfigError("--rebalance-every must be >= 0, got " + std::to_string(o.every));
  }
  if (o.horizon < 1) {
    throw ConfigError("--rebalance-horizon must be >= 1, got " + std::to_string(o.horizon));
  }
  if (!(o.min_gain_ratio >= 0) || !std::isfinite(o.min_gain_ratio)) {
    throw ConfigError("--rebalance-min-gain must be a finite number >= 0, got " +
                      std::to_string(o.min_gain_ratio));
  }
  if (!(o.smoothing > 0 && o.smoothing <= 1)) {
    throw ConfigError("--rebalance-smoothing must be in (0, 1], got " +
                      std::to_string(o.smoothing));
  }
  if (!std::isfinite(o.router_skew) || o.router_skew < 0 || o.router_skew > 50) {
    throw ConfigError("--router-skew must be in [0, 50], got " + std::to_string(o.router_skew));
  }
  if (o.redundant_experts < 0) {
    throw ConfigError("--redundant-experts must be >= 0, got " +
                      std::to_string(o.redundant_experts));
  }
  if (o.redundant_experts > 0 && learner_expert_parallel < 2) {
    throw ConfigError(
        "--redundant-experts needs --expert-parallel >= 2 (replicas live on other EP ranks), "
        "got " +
        std::to_string(learner_expert_parallel));
  }
  if (o.rates != "counted" && o.rates != "measured") {
    throw ConfigError("--rebalance-rates must be counted or measured, got '" + o.rates + "'");
  }
  if (!o.cluster.empty()) {
    if (o.rates == "measured") {
      throw ConfigError(
          "--rebalance-cluster gives counted rates: it cannot go with --rebalance-rates measured");
    }
    const int ep_degree = std::max(learner_expert_parallel, 1);
    counted_rebalance_rates(o, ep_degree, ep_degree);  // reads and checks it
  }
  if (o.every == 0) return;
  if (learner_expert_parallel < 2) {
    throw ConfigError(
        "--rebalance-every needs --expert-parallel >= 2 (experts to move between "
        "ranks), got " +
        std::to_string(learner_expert_parallel));
  }
}

RebalanceRates counted_rebalance_rates(const RebalanceOptions& o, int ep_degree,
                                       int ranks_per_node) {
  RebalanceRates rates;
  if (o.cluster.empty()) return rates;
  const sim::ClusterConfig cluster = sim::load_cluster_config(o.cluster);
  cluster.validate(o.cluster);
  rates.flops = cluster.matmul_flops;
  rates.intra_node_bandwidth = cluster.link(cluster.level_spanned(ranks_per_node)).bandwidth;
  rates.inter_node_bandwidth = cluster.link(cluster.level_spanned(ep_degree)).bandwidth;
  if (!(rates.flops > 0) || !(rates.intra_node_bandwidth > 0) ||
      !(rates.inter_node_bandwidth > 0)) {
    throw ConfigError("--rebalance-cluster '" + o.cluster +
                      "': matmul_flops and the link bandwidth must be > 0");
  }
  return rates;
}

ExpertCluster ep_cluster(const HierarchicalComm& ep_group, int slots_per_rank) {
  const int ranks = ep_group.size(), nodes = ep_group.node_count();
  const ExpertCluster one_node{1, ranks, slots_per_rank};
  if (nodes <= 1 || ranks % nodes != 0) return one_node;
  const int per_node = ranks / nodes;
  for (int r = 0; r < ranks; ++r) {
    if (ep_group.leader_index_of[size_t(r)] != r / per_node) return one_node;
  }
  return {nodes, per_node, slots_per_rank};
}

std::string describe_router_skew(const RebalanceOptions& o) {
  if (o.router_skew == 0.0f) return "";
  char line[200];
  std::snprintf(line, sizeof line,
                "# router skew %g: every router's logits get -%g x expert / (experts - 1), the "
                "model is not the plain one\n",
                double(o.router_skew), double(o.router_skew));
  return line;
}

std::string router_skew_json(const RebalanceOptions& o) {
  char json[160];
  std::snprintf(json, sizeof json,
                "\"router_skew\":%g,\"rebalance_every\":%d,\"redundant_experts\":%d,",
                double(o.router_skew), o.every, o.redundant_experts);
  return json;
}

TrainRebalancer::TrainRebalancer(const RebalanceOptions& options, RoleExpertParallel& ep,
                                 const HierarchicalComm& learners, Transformer<float>& model,
                                 AdamW<float>& optimizer, Transformer<float>* reference,
                                 TraceRecorder& trace, LayerExpertTokens expert_tokens)
    : options_(options),
      ep_(ep),
      learners_(learners),
      model_(model),
      optimizer_(optimizer),
      reference_(reference),
      trace_(trace),
      expert_tokens_(std::move(expert_tokens)),
      predictors_(
          size_t(model.config().n_layers),
          LoadPredictor(model.config().n_experts, LoadPredictorOptions{options.smoothing, 0.0})) {
  const ModelConfig& c = model.config();
  if (reference_ && reference_->layout().total() != model.layout().total()) {
    throw std::logic_error("TrainRebalancer: the reference stores other experts than the policy");
  }
  // The EP group's nodes: moves inside a node are charged the intra-node link, moves between
  // nodes the inter-node one. With redundant slots the proposals replicate the hot experts
  // (place_two_level, incremental_moves).
  cluster_ = ep_cluster(ep.ep_group(), ep.local_slots());
  // (Of the whole model's layout: every layer's experts are alike, and a pipeline stage may not
  // store layer 0.)
  bytes_per_expert_ = expert_bytes(ParameterLayout(c), reference_ ? 4 : 3);
  // The routed experts' share of a token's matmul work: the part of the step's time that
  // follows the busiest EP rank's routed tokens.
  expert_share_ =
      double(c.n_layers) * c.top_k * 3.0 * c.d_model * c.d_ff / double(c.active_parameter_count());
  // Forward (2 FLOPs per weight) and backward (4) of the expert's three d_model x d_ff matrices.
  flops_per_routed_token_ = 6.0 * 3.0 * c.d_model * c.d_ff;
  const Arena& arena = model.device();
  arena_bytes_ =
      double(arena.capacity() - arena.used()) + cluster_.slots_per_device * bytes_per_expert_;
  measured_ = options_.rates == "measured";
  if (options_.every == 0) return;
  // Every learner plans with the same free memory (pipeline stages use different amounts).
  MPI_Allreduce(MPI_IN_PLACE, &arena_bytes_, 1, MPI_DOUBLE, MPI_MIN, learners_.comm);
  double inter_bandwidth = 0;
  if (measured_) {
    // The ring over the whole group crosses the nodes (the slowest link); the rings inside the
    // nodes (every node's ranks at once) time the intra-node link.
    inter_bandwidth = measure_link_rate(ep.ep_group().comm);
    intra_link_rate_ = measure_link_rate(ep.ep_group().intra);
  } else {
    const RebalanceRates rates =
        counted_rebalance_rates(options_, ep.degree(), cluster_.devices_per_node);
    flops_ = rates.flops;
    intra_link_rate_ = rates.intra_node_bandwidth;
    inter_bandwidth = rates.inter_node_bandwidth;
  }
  // Emulated inter-node messages take their delay on top of the transfer itself (one message
  // per expert; the measured test transfers go over MPI directly, without it).
  const double inter_seconds = bytes_per_expert_ / inter_bandwidth +
                               ep.links().emulation().delay_seconds(uint64_t(bytes_per_expert_));
  inter_link_rate_ = bytes_per_expert_ / inter_seconds;
  // A group over nodes of unequal shares is planned as one node at the slower rate.
  const std::vector<int>& node_of_rank = ep.ep_group().leader_index_of;
  const bool spans_nodes =
      std::any_of(node_of_rank.begin(), node_of_rank.end(), [](int node) { return node > 0; });
  if (cluster_.nodes == 1 && spans_nodes) intra_link_rate_ = inter_link_rate_;
}

double TrainRebalancer::seconds_per_token() const {
  if (!measured_) return flops_per_routed_token_ / flops_;
  return expert_share_ * interval_seconds_ / interval_busiest_tokens_;
}

RebalancerState TrainRebalancer::state() const {
  RebalancerState s;
  for (const LoadPredictor& p : predictors_) {
    s.level.push_back(p.level());
    s.trend.push_back(p.trend());
  }
  s.predictor_steps = predictors_.empty() ? 0 : predictors_.front().steps_observed();
  s.interval_seconds = interval_seconds_;
  s.interval_busiest_tokens = interval_busiest_tokens_;
  s.migrations = migrations_;
  return s;
}

void TrainRebalancer::restore(const RebalancerState& s) {
  if (s.level.size() != predictors_.size() || s.trend.size() != predictors_.size()) {
    throw ConfigError("the rebalancer's saved state has " + std::to_string(s.level.size()) +
                      " layers, the model " + std::to_string(predictors_.size()));
  }
  for (size_t l = 0; l < predictors_.size(); ++l)
    predictors_[l].restore(s.level[l], s.trend[l], s.predictor_steps);
  interval_seconds_ = s.interval_seconds;
  interval_busiest_tokens_ = s.interval_busiest_tokens;
  migrations_ = s.migrations;
}

double TrainRebalancer::measure_link_rate(MPI_Comm group) const {
  // Each rank of `group` sends one expert's bytes to the next and receives from the previous one;
  // the best of three rounds, the slowest rank's time.
  int size = 0, rank = 0;
  MPI_Comm_size(group, &size);
  MPI_Comm_rank(group, &rank);
  std::vector<float> out(size_t(bytes_per_expert_ / sizeof(float)), 1.0f), in(out.size());
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    MPI_Barrier(group);
    const double start = MPI_Wtime();
    MPI_Sendrecv(out.data(), int(out.size()), MPI_FLOAT, (rank + 1) % size, 7501, in.data(),
                 int(in.size()), MPI_FLOAT, (rank + size - 1) % size, 7501, group,
                 MPI_STATUS_IGNORE);
    double seconds = MPI_Wtime() - start;
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, group);
    best = std::min(best, seconds);
  }
  // Every learner charges the same rate, so all decide alike.
  double rate = bytes_per_expert_ / std::max(best, 1e-9);
  MPI_Allreduce(MPI_IN_PLACE, &rate, 1, MPI_DOUBLE, MPI_MIN, learners_.comm);
  return rate;
}

std::string TrainRebalancer::describe() const {
  if (options_.every == 0) return "";
  char rates[160];
  if (measured_) {
    std::snprintf(rates, sizeof rates,
                  "the steps' measured wall time (measured rates: decisions not reproducible)");
  } else {
    std::snprintf(rates, sizeof rates, "%.0f FLOPs each per layer at %.3g GFLOP/s (%s)",
                  flops_per_routed_token_, flops_ / 1e9,
                  options_.cluster.empty() ? "default rates" : options_.cluster.c_str());
  }
  const std::string rates_text = rates;
  char cluster[200];
  std::snprintf(cluster, sizeof cluster,
                "the EP group planned as %d node(s) x %d EP ranks, %.3f GB/s between nodes",
                cluster_.nodes, cluster_.devices_per_node, inter_link_rate_ / 1e9);
  const std::string cluster_text = cluster;
  char line[800];
  std::snprintf(line, sizeof line,
                "# rebalancing: every %d steps, horizon %d steps, migrate when gain > %g x cost; "
                "EMA %g, one placement per layer; one expert of one layer (weights + AdamW "
                "moments%s) %.3f MB over the %s link at %.3f GB/s (%s); routed tokens charged at "
                "%s; %d redundant slot(s) per EP rank for replicas of hot experts\n",
                options_.every, options_.horizon, options_.min_gain_ratio, options_.smoothing,
                reference_ ? " + reference" : "", bytes_per_expert_ / 1e6,
                measured_ ? "measured" : "counted", intra_link_rate_ / 1e9, cluster_text.c_str(),
                rates_text.c_str(), ep_.redundant_slots());
  return line;
}

std::vector<std::vector<double>> TrainRebalancer::take_router_loads(int step) {
  const int E = model_.config().n_experts;
  std::vector<std::vector<double>> loads;
  for (int l = 0; l < model_.config().n_layers; ++l) {
    loads.emplace_back(size_t(E), 0.0);
    // (A pipeline stage's other layers: their stages record them.)
    if (!model_.layout().stores_layer(l)) continue;
    std::vector<int64_t> tokens;
    if (expert_tokens_) {
      tokens = expert_tokens_(l);
    } else {
      tokens = model_.expert_dispatcher(l)->take_expert_tokens();
      // With overlap chunks the training forwards dispatch through the chunks' dispatchers.
      if (OverlappedExperts* overlap = model_.expert_overlap(l)) {
        const std::vector<int64_t> chunked = overlap->take_expert_tokens();
        for (size_t e = 0; e < chunked.size(); ++e) tokens[e] += chunked[e];
      }
    }
    for (int e = 0; e < E; ++e) {
      trace_.record_router_load({step, l, e, tokens[size_t(e)]});
      loads.back()[size_t(e)] = double(tokens[size_t(e)]);
    }
  }
  return loads;
}

std::string TrainRebalancer::place_generation(int step, RoleExpertParallel& generation) const {
  if (options_.every == 0 || step % options_.every != 0 || predictors_.empty() ||
      predictors_.front().steps_observed() == 0) {
    return "";
  }
  const int E = model_.config().n_experts, L = int(predictors_.size());
  const ExpertCluster cluster = ep_cluster(generation.ep_group(), generation.local_slots());
  const Placement by_id = placement_of(default_slot_experts(E, generation.degree(), 0), E, cluster);
  std::vector<std::vector<int>> tables;
  double busiest_before = 0, busiest_after = 0, mean = 0;
  int replaced = 0;
  for (int l = 0; l < L; ++l) {
    const std::vector<double> predicted = predictors_[size_t(l)].predict(options_.horizon);
    const Placement fresh = align_to(place_two_level(predicted, cluster), by_id);
    const std::vector<double> before = by_id.device_loads(predicted);
    const double after = max_of(fresh.device_loads(predicted));
    const bool better = after < max_of(before);
    tables.push_back(better ? fresh.slot_expert : by_id.slot_expert);
    replaced += better;
    busiest_before += max_of(before);
    busiest_after += better ? after : max_of(before);
    mean += mean_of(before);
  }
  generation.adopt_slots(tables, L);
  char line[300];
  std::snprintf(line, sizeof line,
                "# generation placement after step %d: %d of %d layers re-placed on %d generation "
                "EP ranks; predicted max/mean generation EP-rank load (busiest per layer, summed) "
                "%.3f at the default placement -> %.3f\n",
                step, replaced, L, generation.degree(), mean > 0 ? busiest_before / mean : 1.0,
                mean > 0 ? busiest_after / mean : 1.0);
  return line;
}

MigrationOptions TrainRebalancer::migration_options() const {
  MigrationOptions m;
  m.bytes_per_expert = bytes_per_expert_;
  m.intra_node_bandwidth = intra_link_rate_;
  m.inter_node_bandwidth = inter_link_rate_;
  m.arena_bytes = arena_bytes_;
  m.seconds_per_token = seconds_per_token();
  m.horizon = options_.horizon;
  m.min_gain_ratio = options_.min_gain_ratio;
  return m;
}

std::string TrainRebalancer::end_of_step(int step, double step_seconds) {
  std::vector<std::vector<double>> loads = take_router_loads(step);
  if (options_.every == 0) return "";
  // Every learner's tokens, so all replicas decide on the same numbers.
  const int L = int(loads.size()), E = model_.config().n_experts;
  std::vector<double> flat;
  for (const std::vector<double>& layer : loads)
    flat.insert(flat.end(), layer.begin(), layer.end());
  MPI_Allreduce(MPI_IN_PLACE, flat.data(), int(flat.size()), MPI_DOUBLE, MPI_SUM, learners_.comm);
  // Counted rates ignore the wall time (a measured quantity), so the decisions are reproducible.
  if (measured_) {
    MPI_Allreduce(MPI_IN_PLACE, &step_seconds, 1, MPI_DOUBLE, MPI_MAX, learners_.comm);
  } else {
    step_seconds = 0;
  }
  const std::vector<std::vector<int>>& slots = ep_.slot_experts();
  std::vector<Placement> current;
  for (int l = 0; l < L; ++l) {
    loads[size_t(l)].assign(flat.begin() + int64_t(l) * E, flat.begin() + int64_t(l + 1) * E);
    predictors_[size_t(l)].observe(loads[size_t(l)]);
    current.push_back(placement_of(slots[size_t(l)], E, cluster_));
    interval_busiest_tokens_ += max_of(current.back().device_loads(loads[size_t(l)]));
  }
  interval_seconds_ += step_seconds;
  if (step % options_.every != 0 || interval_busiest_tokens_ <= 0) return "";
  // Each layer decides on its own (its exchange waits for its own busiest rank).
  ExpertMigration record;
  record.step = step;
  std::vector<std::vector<int>> new_slots = slots;
  double busiest_before = 0, busiest_after = 0, mean = 0;
  for (int l = 0; l < L; ++l) {
    const std::vector<double> predicted = predictors_[size_t(l)].predict(options_.horizon);
    const MigrationPlan decided =
        plan_rebalance(current[size_t(l)], predicted, migration_options(), E);
    const std::vector<double> before = current[size_t(l)].device_loads(predicted);
    busiest_before += max_of(before);
    mean += mean_of(before);
    if (!decided.migrate) {
      busiest_after += max_of(before);
      continue;
    }
    busiest_after += max_of(decided.target.device_loads(predicted));
    new_slots[size_t(l)] = decided.target.slot_expert;
    record.experts_moved +=
        experts_received(slots[size_t(l)], new_slots[size_t(l)], cluster_.slots_per_device, E);
    record.predicted_gain_seconds += decided.gain_seconds;
    record.cost_seconds += decided.seconds;
  }
  interval_seconds_ = interval_busiest_tokens_ = 0;
  if (new_slots == slots) return "";
  record.max_mean_before = mean > 0 ? busiest_before / mean : 1.0;
  record.max_mean_after = mean > 0 ? busiest_after / mean : 1.0;
  std::vector<float*> buffers = {model_.parameters(), optimizer_.first_moment(),
                                 optimizer_.second_moment()};
  if (reference_) buffers.push_back(reference_->parameters());
  {
    TraceScope traced(trace_, Phase::Migrate);
    record.bytes = int64_t(ep_.migrate_slots(new_slots, model_.layout(), buffers));
    traced.set_bytes(record.bytes);
  }
  trace_.record_migration(record);
  ++migrations_;
  char line[400];
  std::snprintf(line, sizeof line,
                "# migration after step %d: %d (layer, expert) pairs to EP ranks that lacked them "
                "(%d replicated), %.3f MB sent by this rank; predicted gain %.4f s over %d steps "
                "vs cost %.4f s; predicted "
                "max/mean EP-rank load (busiest per layer, summed) %.3f -> %.3f\n",
                step, record.experts_moved, ep_.replicated_experts(), double(record.bytes) / 1e6,
                record.predicted_gain_seconds, options_.horizon, record.cost_seconds,
                record.max_mean_before, record.max_mean_after);
  return line;
}

TrainRebalancer::LayerExpertTokens tensor_parallel_expert_tokens(Transformer<float>& model,
                                                                 const TensorParallel* tp,
                                                                 bool expert_token_split) {
  if (!tp || tp->rank() == 0 || expert_token_split) return {};
  return [&model](int layer) {
    std::vector<int64_t> tokens = model.expert_dispatcher(layer)->take_expert_tokens();
    if (OverlappedExperts* overlap = model.expert_overlap(layer)) overlap->take_expert_tokens();
    std::fill(tokens.begin(), tokens.end(), 0);
    return tokens;
  };
}

}  // namespace rlf
