// `rlfusion bench balance`: EDPB on synthetic router statistics and heavy-tailed sample lengths.
// Part 1 replays one drifting-Zipf routing trace against static, EPLB and our placement (with and
// without redundant slots) and reports the measured max/mean device load per step, averaged over
// the steps, with migration time counted as extra load. Part 2 fits the per-sample cost model
// from measured forward+backward times and assigns heavy-tailed batches to data-parallel ranks.
// Loads are counts (seeded, exact on any machine); the migration and step times are modelled from
// the stated expert size, device FLOP/s and link bandwidths; the cost-model fit is timed here.
#include <mpi.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "kernels/device.h"
#include "kernels/error.h"
#include "kernels/rng.h"
#include "src/app/bench_timing.h"
#include "src/app/build_info.h"
#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/balance/data_reordering.h"
#include "src/balance/rebalance_simulation.h"
#include "src/balance/routing_trace.h"
#include "src/model/transformer.h"
#include "src/rl/task.h"

namespace rlf {

namespace {

struct BalanceBenchOptions {
  DriftingZipfOptions routing{64, 16384, 8, 1.2, 1, 1};
  int steps = 200, nodes = 2, devices_per_node = 4, redundant_slots = 1, staging_slots = 9;
  int interval = 5, eplb_interval = 20, horizon = 20, eplb_groups = 8;
  double level_smoothing = 0.3, trend_smoothing = 0.0, min_gain_ratio = 2.0;
  // One routed expert of a Pangu-Ultra-MoE-shaped model: 3 x 7680 x 2048 parameters; fp32
  // weights plus the two AdamW moments (as rlfusion trains) = 12 bytes per parameter.
  double expert_params = 3.0 * 7680 * 2048, bytes_per_param = 12, device_tflops = 300;
  double intra_bandwidth = 100e9, inter_bandwidth = 25e9;
  // Data reordering.
  std::string task = "sort-heavytail", cost_model, routing_trace;
  int batch = 256, dp = 8, batches = 20, repeats = 3;
};

struct DataResult {
  std::string lengths_from;
  SampleCostModel model;
  std::vector<std::pair<double, double>> measured;          // (length, seconds)
  double reordered = 0, worst_reordered = 0, in_order = 0;  // slowest rank / lower bound
  double max_length = 0, mean_length = 0;
  bool batch_kept = true;
};

// Median forward+backward seconds of one sequence per length, on `model`'s parameters.
std::vector<std::pair<double, double>> time_lengths(const ModelConfig& config, Arena& device,
                                                    const std::vector<int>& lengths, int repeats) {
  ArenaScope scope(device);
  Transformer<float> model(config, cpu_ops(), device, /*with_gradients=*/true);
  model.initialize(1);
  std::vector<std::pair<double, double>> out;
  for (int T : lengths) {
    std::vector<int> tokens(static_cast<size_t>(T)), offsets{0, T};
    for (int n = 0; n < T; ++n) {
      tokens[size_t(n)] = int(random_words(3, 0, uint64_t(n))[0] % uint32_t(config.vocab_size));
    }
    std::vector<float> dlogits(size_t(T) * size_t(config.vocab_size), 1e-3f);
    const double seconds = time_interleaved({[&] {
                                              model.forward(tokens.data(), offsets.data(), 1);
                                              model.backward(dlogits.data(), 0.01f);
                                            }},
                                            repeats)[0];
    out.emplace_back(double(T), seconds);
  }
  return out;
}

SampleCostModel parse_cost_model(const std::string& text) {
  std::istringstream in(text);
  SampleCostModel m;
  char c1 = 0, c2 = 0;
  if (!(in >> m.fixed >> c1 >> m.per_token >> c2 >> m.per_token_squared) || c1 != ',' ||
      c2 != ',' || !in.eof()) {
    throw ConfigError(
        "--cost-model expects three numbers 'fixed,per_token,per_token_squared', got '" + text +
        "'");
  }
  return m;
}

DataResult bench_reordering(const BalanceBenchOptions& o, const RunOptions& run) {
  DataResult r;
  const std::unique_ptr<Task> task = make_task(load_task_config(o.task, run.seed));
  // A training sequence: <bos> prompt response <eos>.
  auto sequence_length = [&](int64_t id) {
    const TaskSample s = task->train_sample(id);
    return double(s.prompt.size() + s.answer.size() + 2);
  };
  if (o.cost_model.empty()) {
    const ModelConfig config = load_model_config(run.model);
    const int longest =
        std::min(config.max_seq_len, task->max_prompt_chars() + task->max_response_chars() + 2);
    std::vector<int> lengths;
    for (int k = 1; k <= 6; ++k) lengths.push_back(std::max(2, longest * k / 6));
    Device accelerator(Backend::Cpu, run.device_memory_bytes(), resolve_threads(run.threads));
    r.measured = time_lengths(config, accelerator.memory(), lengths, o.repeats);
    std::vector<double> x, y;
    for (const auto& [length, seconds] : r.measured) {
      x.push_back(length);
      y.push_back(seconds);
    }
    r.model = fit_sample_cost_model(x, y);
    r.lengths_from = "fitted to model '" + config.name + "' fwd+bwd times";
  } else {
    r.model = parse_cost_model(o.cost_model);
    r.lengths_from = "given by --cost-model";
  }
  int64_t id = 0;
  double length_sum = 0;
  for (int b = 0; b < o.batches; ++b) {
    std::vector<double> costs;
    for (int i = 0; i < o.batch; ++i, ++id) {
      const double length = sequence_length(id);
      r.max_length = std::max(r.max_length, length);
      length_sum += length;
      costs.push_back(std::max(0.0, r.model.cost(length)));
    }
    const double bound = assignment_lower_bound(costs, o.dp);
    const RankAssignment greedy = assign_samples_to_ranks(costs, o.dp);
    std::vector<int> all;
    for (const auto& s : greedy.samples) all.insert(all.end(), s.begin(), s.end());
    std::sort(all.begin(), all.end());
    for (int i = 0; i < o.batch; ++i)
      r.batch_kept &= all.size() == size_t(o.batch) && all[size_t(i)] == i;
    const double ratio = bound > 0 ? max_of(greedy.load) / bound : 1.0;
    r.reordered += ratio / o.batches;
    r.worst_reordered = std::max(r.worst_reordered, ratio);
    const RankAssignment plain = assign_samples_in_order(costs, o.dp);
    r.in_order += (bound > 0 ? max_of(plain.load) / bound : 1.0) / o.batches;
  }
  r.mean_length = length_sum / (double(o.batches) * o.batch);
  return r;
}

}  // namespace

int run_bench_balance_command(const std::vector<std::string>& args) {
  RunOptions run;
  run.model = "tiny";
  BalanceBenchOptions o;
  po::options_description description = run_options_description(run);
  po::options_description bench("bench balance options");
  auto add = bench.add_options();
  add("experts", po::value(&o.routing.experts)->default_value(o.routing.experts),
      "routed experts (E)");
  add("tokens", po::value(&o.routing.tokens)->default_value(o.routing.tokens), "tokens per step");
  add("top-k", po::value(&o.routing.top_k)->default_value(o.routing.top_k),
      "experts per token (K)");
  add("zipf", po::value(&o.routing.zipf)->default_value(o.routing.zipf),
      "popularity exponent: the expert of rank r gets weight r^-zipf");
  add("drift-swaps", po::value(&o.routing.drift_swaps)->default_value(o.routing.drift_swaps),
      "random adjacent transpositions of the popularity ranking per step");
  add("routing-trace", po::value(&o.routing_trace),
      "recorded router statistics to replay instead of the synthetic trace (one step per line, "
      "tokens per expert separated by commas; the first line is the profiling step)");
  add("steps", po::value(&o.steps)->default_value(o.steps), "measured steps");
  add("nodes", po::value(&o.nodes)->default_value(o.nodes), "nodes");
  add("devices-per-node", po::value(&o.devices_per_node)->default_value(o.devices_per_node),
      "devices per node");
  add("redundant-slots", po::value(&o.redundant_slots)->default_value(o.redundant_slots),
      "expert slots per device beyond experts / devices (for replicas)");
  add("staging-slots", po::value(&o.staging_slots)->default_value(o.staging_slots),
      "arena room per device for experts received during a migration, in expert slots");
  add("rebalance-interval", po::value(&o.interval)->default_value(o.interval),
      "steps between rebalancing decisions");
  add("eplb-interval", po::value(&o.eplb_interval)->default_value(o.eplb_interval),
      "EPLB also at this interval (its window = its interval): fewer, larger migrations");
  add("horizon", po::value(&o.horizon)->default_value(o.horizon),
      "steps a migration's gain is counted over (ours)");
  add("min-gain-ratio", po::value(&o.min_gain_ratio)->default_value(o.min_gain_ratio),
      "ours migrates when predicted gain > this x migration time");
  add("level-smoothing", po::value(&o.level_smoothing)->default_value(o.level_smoothing),
      "load prediction: EMA weight of the newest step, in (0, 1]");
  add("trend-smoothing", po::value(&o.trend_smoothing)->default_value(o.trend_smoothing),
      "load prediction: weight of the newest slope, in [0, 1] (0: EMA only)");
  add("eplb-groups", po::value(&o.eplb_groups)->default_value(o.eplb_groups), "EPLB expert groups");
  add("expert-params", po::value(&o.expert_params)->default_value(o.expert_params),
      "parameters of one routed expert");
  add("bytes-per-param", po::value(&o.bytes_per_param)->default_value(o.bytes_per_param),
      "bytes moved per expert parameter (weights + optimizer states)");
  add("device-tflops", po::value(&o.device_tflops)->default_value(o.device_tflops),
      "device throughput for expert FLOPs (6 x params per routed token, fwd+bwd)");
  add("migration-intra-bandwidth", po::value(&o.intra_bandwidth)->default_value(o.intra_bandwidth),
      "bytes/s of a device link inside a node");
  add("migration-inter-bandwidth", po::value(&o.inter_bandwidth)->default_value(o.inter_bandwidth),
      "bytes/s of a device link across nodes");
  add("task", po::value(&o.task)->default_value(o.task), "task whose sample lengths are reordered");
  add("batch", po::value(&o.batch)->default_value(o.batch), "global batch (samples)");
  add("dp", po::value(&o.dp)->default_value(o.dp), "data-parallel ranks");
  add("batches", po::value(&o.batches)->default_value(o.batches), "batches averaged");
  add("cost-model", po::value(&o.cost_model),
      "fixed,per_token,per_token_squared seconds instead of the timed fit");
  add("repeats", po::value(&o.repeats)->default_value(o.repeats),
      "timed repeats per length for the cost-model fit (median, >= 3)");
  description.add(bench);
  if (!parse_options("bench balance", args, description, run)) return 0;

  // Every check is arithmetic on the options: the same error on every rank, before any work.
  o.routing.seed = run.seed;
  o.routing.validate();
  std::vector<std::vector<double>> trace;
  if (!o.routing_trace.empty()) {
    trace = read_routing_trace(o.routing_trace);
    o.routing.experts = int(trace[0].size());
    o.steps = int(trace.size()) - 1;
  }
  if (o.eplb_interval < 1) throw ConfigError("--eplb-interval must be >= 1");
  if (o.steps < 1 || o.batch < 1 || o.dp < 1 || o.batches < 1) {
    throw ConfigError("--steps, --batch, --dp and --batches must be >= 1");
  }
  if (o.repeats < 3) throw ConfigError("--repeats must be >= 3, got " + std::to_string(o.repeats));
  if (o.redundant_slots < 0 || o.staging_slots < 0) {
    throw ConfigError("--redundant-slots and --staging-slots must be >= 0");
  }
  if (!(o.expert_params > 0 && o.bytes_per_param > 0 && o.device_tflops > 0)) {
    throw ConfigError("--expert-params, --bytes-per-param and --device-tflops must be > 0");
  }
  const int devices = o.nodes * o.devices_per_node;
  if (o.nodes < 1 || o.devices_per_node < 1 || o.routing.experts % devices != 0) {
    throw ConfigError("--nodes x --devices-per-node must divide --experts (" +
                      std::to_string(o.routing.experts) + ")");
  }
  const int base_slots = o.routing.experts / devices;
  std::vector<RebalanceOptions> setups;
  for (int spd : {base_slots + o.redundant_slots, base_slots}) {
    RebalanceOptions r;
    r.cluster = {o.nodes, o.devices_per_node, spd};
    r.interval = o.interval;
    r.eplb_groups = o.eplb_groups;
    r.predictor = {o.level_smoothing, o.trend_smoothing};
    MigrationOptions& m = r.migration;
    m.bytes_per_expert = o.expert_params * o.bytes_per_param;
    m.intra_node_bandwidth = o.intra_bandwidth;
    m.inter_node_bandwidth = o.inter_bandwidth;
    m.arena_bytes = m.bytes_per_expert * (spd + o.staging_slots);
    m.seconds_per_token = 6 * o.expert_params / (o.device_tflops * 1e12);
    m.horizon = o.horizon;
    m.min_gain_ratio = o.min_gain_ratio;
    r.validate(o.routing.experts);
    if (o.eplb_groups < 1 || o.routing.experts % o.eplb_groups != 0) {
      throw ConfigError("--eplb-groups " + std::to_string(o.eplb_groups) +
                        " must divide --experts (" + std::to_string(o.routing.experts) + ")");
    }
    setups.push_back(r);
    if (o.redundant_slots == 0) break;
  }
  if (!o.cost_model.empty()) parse_cost_model(o.cost_model);

  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return 0;  // the figures are one process's; other ranks have nothing to add

  if (trace.empty()) {
    DriftingZipfRouter router(o.routing);
    for (int t = 0; t <= o.steps; ++t) trace.push_back(router.next_step());
  }
  std::vector<RebalanceResult> results;
  for (const RebalanceOptions& setup : setups) {
    results.push_back(simulate_rebalancing(trace, BalancePolicy::Static, setup));
    results.push_back(simulate_rebalancing(trace, BalancePolicy::Eplb, setup));
    RebalanceOptions slower = setup;
    slower.interval = o.eplb_interval;
    results.push_back(simulate_rebalancing(trace, BalancePolicy::Eplb, slower));
    results.push_back(simulate_rebalancing(trace, BalancePolicy::Ours, setup));
  }
  const DataResult data = bench_reordering(o, run);

  const MigrationOptions& m = setups[0].migration;
  std::printf("# rlfusion bench balance: %s\n", build_info().c_str());
  if (o.routing_trace.empty()) {
    std::printf(
        "# part 1, experts: %d experts on %d nodes x %d devices, %d tokens/step, top-%d, Zipf(%g) "
        "popularity over a ranking; drift: %d random adjacent rank swaps per step; %d measured "
        "steps after 1 profiling step, seed %llu\n",
        o.routing.experts, o.nodes, o.devices_per_node, o.routing.tokens, o.routing.top_k,
        o.routing.zipf, o.routing.drift_swaps, o.steps, (unsigned long long)run.seed);
  } else {
    std::printf(
        "# part 1, experts: recorded trace '%s': %d experts on %d nodes x %d devices, %d measured "
        "steps after 1 profiling step\n",
        o.routing_trace.c_str(), o.routing.experts, o.nodes, o.devices_per_node, o.steps);
  }
  std::printf(
      "# rebalance every %d steps; ours: EMA(%.2f)+trend(%.2f) prediction, gain over %d steps > "
      "%.2f x cost; EPLB (%d groups) every %d and every %d steps: mean of the steps since its last "
      "decision, always migrates\n",
      o.interval, o.level_smoothing, o.trend_smoothing, o.horizon, o.min_gain_ratio, o.eplb_groups,
      o.interval, o.eplb_interval);
  std::printf(
      "# migration (modelled): %.3g B per expert (%.3g params x %g B), %.3g B/s intra-node, %.3g "
      "B/s inter-node, arena = slots + %d staging slots; expert time %.3g s per routed token "
      "(%g TFLOP/s)\n",
      m.bytes_per_expert, o.expert_params, o.bytes_per_param, m.intra_node_bandwidth,
      m.inter_node_bandwidth, o.staging_slots, m.seconds_per_token, o.device_tflops);
  std::printf(
      "# max/mean = measured device loads of each step (tokens), migration time added to "
      "the slowest device as tokens, averaged over steps\n#\n");
  std::printf("# %-7s %6s %8s %9s %9s %9s %6s %8s %9s %9s %10s\n", "policy", "slots", "interval",
              "max/mean", "load only", "worst", "moves", "refused", "intra", "inter",
              "expert time");
  std::printf("# %-7s %6s %8s %9s %9s %9s %6s %8s %9s %9s %10s\n", "", "/dev", "(steps)", "", "",
              "(step)", "", "(cost)", "(GB)", "(GB)", "(ms/step)");
  for (const RebalanceResult& r : results) {
    std::printf("  %-7s %6d %8s %9.4f %9.4f %9.4f %6d %8d %9.2f %9.2f %10.3f\n",
                balance_policy_name(r.policy), r.slots_per_device,
                r.policy == BalancePolicy::Static ? "-" : std::to_string(r.interval).c_str(),
                r.imbalance, r.load_imbalance, r.worst_step, r.migrations, r.refused_threshold,
                r.intra_node_bytes / 1e9, r.inter_node_bytes / 1e9,
                r.expert_seconds_per_step * 1e3);
  }
  const RebalanceResult &eplb = results[1], &eplb_slower = results[2], &ours = results[3];
  int arena_refusals = 0;
  for (const RebalanceResult& r : results) arena_refusals += r.refused_arena;
  std::printf(
      "#\n# Ours max/mean (%d slots/device)       : %.4f (target <= 1.15) %s; EPLB %.4f / %.4f "
      "(every %d / %d steps)\n",
      ours.slots_per_device, ours.imbalance, ours.imbalance <= 1.15 ? "OK" : "ABOVE TARGET",
      eplb.imbalance, eplb_slower.imbalance, o.interval, o.eplb_interval);
  if (results.size() > 4) {
    std::printf("# Ours max/mean without redundant slots: %.4f; EPLB %.4f / %.4f\n",
                results[7].imbalance, results[5].imbalance, results[6].imbalance);
  }
  std::printf(
      "# Migrations refused by the arena      : %d (ours: largest device peak of a migration "
      "carried out %.3g B, arena %.3g B)\n",
      arena_refusals, ours.peak_bytes, m.arena_bytes);

  std::printf(
      "#\n# part 2, data reordering: task '%s' (%d batches of %d samples, lengths mean %.1f, max "
      "%.0f tokens) on %d DP ranks\n",
      o.task.c_str(), o.batches, o.batch, data.mean_length, data.max_length, o.dp);
  std::printf("# cost model %s: %.4g s + %.4g s/token x L + %.4g s/token^2 x L^2\n",
              data.lengths_from.c_str(), data.model.fixed, data.model.per_token,
              data.model.per_token_squared);
  if (!data.measured.empty()) {
    double load[1] = {-1};
    if (getloadavg(load, 1) != 1) load[0] = -1;
    std::printf("# %-10s %12s %12s   (timed at load average %.2f)\n", "length", "measured",
                "fitted", load[0]);
    std::printf("# %-10s %12s %12s\n", "(tokens)", "(ms)", "(ms)");
    for (const auto& [length, seconds] : data.measured) {
      std::printf("  %-10.0f %12.4f %12.4f\n", length, seconds * 1e3,
                  data.model.cost(length) * 1e3);
    }
  }
  const double reorder_target = 1.10;
  std::printf("# %-26s %14s %14s\n", "assignment", "slowest/bound", "worst batch");
  std::printf("  %-26s %14.4f %14s\n", "in order (blocks)", data.in_order, "");
  std::printf("  %-26s %14.4f %14.4f\n", "reordered (greedy LPT)", data.reordered,
              data.worst_reordered);
  std::printf("#\n# Reordered slowest rank / max(mean, largest sample): %.4f (target <= %.2f) %s\n",
              data.reordered, reorder_target,
              data.reordered <= reorder_target ? "OK" : "ABOVE TARGET");
  std::printf("# Global batch kept (every sample on exactly one rank): %s\n",
              data.batch_kept ? "OK" : "FAIL");

  if (run.json) {
    std::printf(
        "{\"bench\":\"balance\",\"experts\":%d,\"nodes\":%d,\"devices_per_node\":%d,\"tokens\":%d,"
        "\"top_k\":%d,\"zipf\":%g,\"drift_swaps\":%d,\"steps\":%d,\"rebalance_interval\":%d,"
        "\"horizon\":%d,\"min_gain_ratio\":%g,\"intra_node_bandwidth\":%g,"
        "\"inter_node_bandwidth\":%g,\"bytes_per_expert\":%g,\"rows\":[",
        o.routing.experts, o.nodes, o.devices_per_node, o.routing.tokens, o.routing.top_k,
        o.routing.zipf, o.routing.drift_swaps, o.steps, o.interval, o.horizon, o.min_gain_ratio,
        m.intra_node_bandwidth, m.inter_node_bandwidth, m.bytes_per_expert);
    for (size_t i = 0; i < results.size(); ++i) {
      const RebalanceResult& r = results[i];
      std::printf(
          "%s{\"policy\":\"%s\",\"slots_per_device\":%d,\"interval\":%d,\"imbalance\":%.6f,\"load_"
          "imbalance\":%.6f,"
          "\"worst_step\":%.6f,\"migrations\":%d,\"refused_threshold\":%d,\"refused_arena\":%d,"
          "\"intra_node_bytes\":%.6e,\"inter_node_bytes\":%.6e,\"expert_seconds_per_step\":%.6e}",
          i ? "," : "", balance_policy_name(r.policy), r.slots_per_device, r.interval, r.imbalance,
          r.load_imbalance, r.worst_step, r.migrations, r.refused_threshold, r.refused_arena,
          r.intra_node_bytes, r.inter_node_bytes, r.expert_seconds_per_step);
    }
    std::printf(
        "],\"reorder\":{\"task\":\"%s\",\"batch\":%d,\"dp\":%d,\"batches\":%d,\"fixed\":%.6e,"
        "\"per_token\":%.6e,\"per_token_squared\":%.6e,\"reordered\":%.6f,\"worst_reordered\":%.6f,"
        "\"in_order\":%.6f,\"batch_kept\":%d}}\n",
        o.task.c_str(), o.batch, o.dp, o.batches, data.model.fixed, data.model.per_token,
        data.model.per_token_squared, data.reordered, data.worst_reordered, data.in_order,
        data.batch_kept ? 1 : 0);
  }
  return data.batch_kept ? 0 : 1;
}

}  // namespace rlf
