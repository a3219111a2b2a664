// `rlfusion plan`: DeployMind's planner. Evaluates one strategy (--mode given) or searches the
// strategy space under the device memory limit and ranks the results; `--table 1|2` predicts the
// public report's throughput tables; `--validate CSV` compares predictions with measured runs
// (jobs/local/validate_planner.sh). Runs on one rank; every figure is a prediction of the model in
// src/sim/ (docs/DEPLOYMIND.md).
#include <boost/program_options.hpp>
#include <cstdio>
#include <iterator>
#include <string>

#include "kernels/error.h"
#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/app/plan_validation.h"
#include "src/sim/cost_model.h"
#include "src/sim/search.h"
#include "src/sim/tables.h"

namespace rlf {

namespace {

using namespace rlf::sim;

struct PlanOptions {
  std::string cluster = "cloudmatrix-384", job = "pangu-rl", mode, dispatch = "flat";
  std::string modes = "disaggregated,fused,fused-all", staleness_list = "0,1", validate;
  int supernodes = 0, devices = 0, table = 0, staleness = 0, redundant_experts = 0;
  int max_redundant_experts = 2;
  Parallelism train, generate;
  bool offload = false, ep_overlap = false, recompute = false, rebalance = false;
  bool no_rebalance = false;
};

constexpr double kGiB = 1024.0 * 1024 * 1024;

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", bytes / kGiB);
  return text;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::vector<int> parse_int_list(const std::string& text, const std::string& option) {
  std::vector<int> out;
  for (const std::string& word : split_commas(text)) {
    try {
      size_t used = 0;
      const int v = std::stoi(word, &used);
      if (used != word.size() || v < 0) throw std::invalid_argument(word);
      out.push_back(v);
    } catch (const std::exception&) {
      throw ConfigError(option + " must be a comma-separated list of integers >= 0, got '" + text +
                        "'");
    }
  }
  return out;
}

void print_prediction(const Strategy& s, const Prediction& p, const ModelShape& model,
                      const ClusterConfig& cluster, const RlJob& job, bool json) {
  // What the EP group waits for: the hottest expert's rank, under EDPB's placement (with its spare
  // slots, if any) where the strategy rebalances.
  const int ep = s.train.ep;
  const double hottest = expert_load_factor(model, job, ep, training_placement(s));
  const auto parts = step_parts(p);
  const double first_migration = first_migration_seconds(model, cluster, job, s);
  if (json) {
    std::printf("{\"command\":\"plan\",\"strategy\":\"%s\",\"parts_s\":", s.describe().c_str());
    print_step_parts_json(p);
    std::printf(
        ",\"step_s\":%.6g,\"tokens_per_s\":%.6g,\"training_memory_bytes\":%.6g,"
        "\"generation_memory_bytes\":%.6g,\"memory_capacity_bytes\":%.6g,\"fits\":%s,"
        "\"training_hottest_ep_rank_load\":%.6g,\"first_migration_s\":%.6g}\n",
        p.step, p.tokens_per_second, p.training_memory, p.generation_memory, cluster.memory_bytes,
        p.fits ? "true" : "false", hottest, first_migration);
    return;
  }
  std::printf("# strategy: %s on %d devices\n", s.describe().c_str(), s.devices());
  std::printf("# %-16s %12s %9s\n", "part", "time", "share");
  std::printf("# %-16s %12s %9s\n", "", "(s/step)", "(%)");
  for (const NamedPart& part : parts)
    std::printf("  %-16s %12.4f %9.1f\n", part.name, part.seconds, 100 * part.seconds / p.step);
  std::printf("  %-16s %12.4f %9s\n", "step", p.step,
              s.mode == Mode::Disaggregated && s.staleness > 0 ? "(overlap)" : "");
  std::printf("# tokens per step %.0f; predicted throughput %.1f tokens/s\n", job.tokens_per_step(),
              p.tokens_per_second);
  std::printf(
      "# memory per device: training %.2f GiB, generation %.2f GiB, capacity %.2f GiB: %s\n",
      p.training_memory / kGiB, p.generation_memory / kGiB, cluster.memory_bytes / kGiB,
      p.fits ? "fits" : "DOES NOT FIT");
  if (ep > 1 && (job.router_max_over_mean != 1 || s.rebalance)) {
    std::printf(
        "# training EP %d: the hottest expert's rank takes %.3f x the mean rank's routed rows "
        "(contiguous blocks: %.3f)%s\n",
        ep, hottest, expert_load_factor(model, job, ep, ExpertPlacement{}),
        s.redundant_experts > 0 ? ", with EDPB's spare slots"
        : s.rebalance           ? ", EDPB's placement"
                                : "");
  }
  if (ep > 1 && s.rebalance) {
    std::printf(
        "# EDPB's first placement: %.4f s once (not in the step); after it %.3g of the (layer, "
        "expert) pairs move per step (job.expert_moves_per_step): %.4f s a step\n",
        first_migration, job.expert_moves_per_step, p.migration);
  }
}

void print_ranked(const SearchResult& r, bool json) {
  const double per_minute = r.rate() * 60;
  if (json) {
    std::printf(
        "{\"command\":\"plan\",\"searched\":%lld,\"feasible\":%lld,\"fitting\":%lld,"
        "\"seconds\":%.6g,\"strategies_per_minute\":%.6g,\"best\":[",
        (long long)r.evaluated, (long long)r.feasible, (long long)r.fitting, r.seconds, per_minute);
    for (size_t i = 0; i < r.best.size(); ++i) {
      const Prediction& p = r.best[i].prediction;
      std::printf(
          "%s{\"strategy\":\"%s\",\"step_s\":%.6g,\"tokens_per_s\":%.6g,"
          "\"training_memory_bytes\":%.6g,\"generation_memory_bytes\":%.6g}",
          i ? "," : "", r.best[i].strategy.describe().c_str(), p.step, p.tokens_per_second,
          p.training_memory, p.generation_memory);
    }
    std::printf("]}\n");
    return;
  }
  std::printf("# %4s %-52s %10s %9s %9s %9s %9s %12s %9s %9s\n", "rank", "strategy", "step",
              "generate", "train", "a2a", "bubble", "tokens/s", "mem-train", "mem-gen");
  std::printf("# %4s %-52s %10s %9s %9s %9s %9s %12s %9s %9s\n", "", "", "(s)", "(s)", "(s)", "(s)",
              "(s)", "(tokens/s)", "(GiB)", "(GiB)");
  for (size_t i = 0; i < r.best.size(); ++i) {
    const Prediction& p = r.best[i].prediction;
    std::printf("  %4zu %-52s %10.3f %9.3f %9.3f %9.3f %9.3f %12.1f %9.2f %9.2f\n", i + 1,
                r.best[i].strategy.describe().c_str(), p.step, p.generation, p.training,
                p.all_to_all, p.pipeline, p.tokens_per_second, p.training_memory / kGiB,
                p.generation_memory / kGiB);
  }
  std::printf(
      "# searched %lld index points: %lld strategies predicted by the cost model, %lld fit in "
      "memory, in %.3f s: %.3g strategies predicted per minute (target >= 1e6/minute: %s)\n",
      (long long)r.evaluated, (long long)r.feasible, (long long)r.fitting, r.seconds, per_minute,
      per_minute >= 1e6 ? "met" : "NOT met");
}

void print_table(int number, const std::vector<TableRow>& rows, bool json) {
  if (json) {
    std::printf("{\"command\":\"plan\",\"table\":%d,\"rows\":[", number);
    for (size_t i = 0; i < rows.size(); ++i) {
      const TableRow& row = rows[i];
      const bool found = !row.result.best.empty();
      std::printf(
          "%s{\"setting\":\"%s\",\"supernodes\":%d,\"predicted_tokens_per_s\":%.6g,"
          "\"published_tokens_per_s\":%.6g,\"strategy\":\"%s\"}",
          i ? "," : "", row.setting.c_str(), row.supernodes,
          found ? row.result.best[0].prediction.tokens_per_second : 0.0,
          row.published_tokens_per_second,
          found ? row.result.best[0].strategy.describe().c_str() : "");
    }
    std::printf("]}\n");
    return;
  }
  std::printf("# Table %d, PREDICTED by the planner (not measured), beside the published figures\n",
              number);
  std::printf("# %-32s %10s %12s %8s %12s %8s %8s %8s %8s  %-40s %s\n", "setting", "supernodes",
              "predicted", "ratio", "published", "ratio", "step", "generate", "train",
              "best strategy", "published note");
  std::printf("# %-32s %10s %12s %8s %12s %8s %8s %8s %8s\n", "", "", "(tokens/s)", "",
              "(tokens/s)", "", "(s)", "(s)", "(s)");
  const double first = rows.empty() || rows[0].result.best.empty()
                           ? 0
                           : rows[0].result.best[0].prediction.tokens_per_second;
  const double first_published = rows.empty() ? 0 : rows[0].published_tokens_per_second;
  for (size_t i = 0; i < rows.size(); ++i) {
    const TableRow& row = rows[i];
    if (row.result.best.empty()) {
      std::printf("  %-32s %10d %12s\n", row.setting.c_str(), row.supernodes, "no fit");
      continue;
    }
    const double predicted = row.result.best[0].prediction.tokens_per_second;
    // Table 1: ratio to the first row; Table 2: linearity against the same setting on 1 supernode.
    double base = first, base_published = first_published;
    if (number == 2) {
      const TableRow& one = rows[i % 2];
      base = one.result.best.empty()
                 ? 0
                 : one.result.best[0].prediction.tokens_per_second * row.supernodes;
      base_published = one.published_tokens_per_second * row.supernodes;
    }
    char published[32] = "-", published_ratio[32] = "-";
    if (row.published_tokens_per_second > 0) {
      std::snprintf(published, sizeof published, "%.0f", row.published_tokens_per_second);
      std::snprintf(published_ratio, sizeof published_ratio, "%.2f",
                    row.published_tokens_per_second / base_published);
    }
    const Prediction& p = row.result.best[0].prediction;
    const double training = p.training_total();
    std::printf("  %-32s %10d %12.0f %8.2f %12s %8s %8.1f %8.1f %8.1f  %-40s %s\n",
                row.setting.c_str(), row.supernodes, predicted, base > 0 ? predicted / base : 0.0,
                published, published_ratio, p.step, p.generation, training,
                row.result.best[0].strategy.describe().c_str(), row.published_note.c_str());
  }
  std::printf("# ratio: %s\n", number == 1 ? "tokens/s / the disaggregated synchronous row"
                                           : "linearity, tokens/s / (supernodes x the same "
                                             "setting on 1 supernode)");
}

}  // namespace

int run_plan_command(const std::vector<std::string>& args) {
  RunOptions run;
  run.model = "pangu-ultra-moe-718b";
  PlanOptions o;
  po::options_description description = run_options_description(run);
  {
    po::options_description d("plan");
    auto add = d.add_options();
    add("cluster", po::value(&o.cluster)->default_value(o.cluster),
        "cluster description: a path or a name in inputs/clusters/");
    add("job", po::value(&o.job)->default_value(o.job), "RL job: a path or a name in inputs/jobs/");
    add("supernodes", po::value(&o.supernodes)->default_value(0),
        "supernodes of the cluster to use (0: the cluster file's)");
    add("devices", po::value(&o.devices)->default_value(0),
        "devices to deploy on (0: every device of the cluster)");
    add("mode", po::value(&o.mode),
        "evaluate one strategy: disaggregated | fused | fused-all "
        "(without it, search)");
    add("train-tp", po::value(&o.train.tp)->default_value(1), "training tensor parallelism");
    add("train-pp", po::value(&o.train.pp)->default_value(1), "training pipeline stages");
    add("train-vpp", po::value(&o.train.vpp)->default_value(1), "virtual stages per device");
    add("train-ep", po::value(&o.train.ep)->default_value(1), "training expert parallelism");
    add("train-dp", po::value(&o.train.dp)->default_value(0),
        "training data parallelism (0: the devices left)");
    add("gen-tp", po::value(&o.generate.tp)->default_value(1), "generation tensor parallelism");
    add("gen-ep", po::value(&o.generate.ep)->default_value(1), "generation expert parallelism");
    add("gen-pp", po::value(&o.generate.pp)->default_value(1),
        "generation pipeline parallelism: 1, or (fused, synchronous) --train-pp with the "
        "training's TP and EP: generation inside the training pipelines");
    add("gen-dp", po::value(&o.generate.dp)->default_value(0),
        "generation data parallelism (0: the devices left)");
    add("staleness", po::value(&o.staleness)->default_value(0), "StaleSync bound (0: synchronous)");
    add("offload", po::bool_switch(&o.offload), "fused: offload gradients and optimizer states");
    add("ep-overlap", po::bool_switch(&o.ep_overlap), "overlap EP communication with experts");
    add("recompute", po::bool_switch(&o.recompute), "training recomputes activations");
    add("dispatch", po::value(&o.dispatch)->default_value(o.dispatch), "EP dispatch: flat | dedup");
    add("rebalance", po::bool_switch(&o.rebalance),
        "EDPB moves experts between the training EP ranks (train --rebalance-every)");
    add("redundant-experts", po::value(&o.redundant_experts)->default_value(0),
        "spare expert slots per training EP rank, placed by EDPB (train --redundant-experts; "
        "implies --rebalance)");
    add("no-rebalance", po::bool_switch(&o.no_rebalance),
        "search and --table: leave EDPB's rebalancing (and its spare slots) out");
    add("max-redundant-experts",
        po::value(&o.max_redundant_experts)->default_value(o.max_redundant_experts),
        "search: spare expert slots per training EP rank to consider, 0 .. this");
    add("modes", po::value(&o.modes)->default_value(o.modes), "search: modes to consider");
    add("staleness-bounds", po::value(&o.staleness_list)->default_value(o.staleness_list),
        "search: staleness bounds to consider");
    add("table", po::value(&o.table)->default_value(0),
        "predict the public report's Table 1 or Table 2");
    add("validate", po::value(&o.validate),
        "CSV of measured runs (jobs/local/validate_planner.sh): predicted vs measured per case");
    description.add(d);
  }
  if (!parse_options("plan", args, description, run)) return 0;
  if (!o.validate.empty()) return run_plan_validation(o.validate, run.json);
  ClusterConfig cluster = load_cluster_config(o.cluster);
  if (o.supernodes < 0) throw ConfigError("--supernodes must be >= 0");
  if (o.supernodes > 0) cluster.supernodes = o.supernodes;
  const ModelConfig config = load_model_config(run.model);
  const ModelShape model = model_shape(config);
  RlJob job = load_rl_job(o.job);
  check_router_concentration(job, config.n_experts, config.top_k, "plan --job " + o.job);
  if (o.redundant_experts < 0 || o.max_redundant_experts < 0 ||
      o.max_redundant_experts > RebalancedLoads::kMostSpareSlots) {
    throw ConfigError("--redundant-experts must be >= 0 and --max-redundant-experts in [0, " +
                      std::to_string(RebalancedLoads::kMostSpareSlots) + "]");
  }
  prepare_rebalanced_loads(job, config.n_experts);
  if (o.devices < 0 || o.devices > cluster.devices())
    throw ConfigError("--devices must be in [0, " + std::to_string(cluster.devices()) + "]");
  const int devices = o.devices > 0 ? o.devices : cluster.devices();

  if (!run.json) {
    std::printf(
        "# rlfusion plan: model %s (%.3g parameters), cluster %s (%d devices, %.0f GiB "
        "each), job %s (%lld samples/step, %.0f tokens/step)\n",
        config.name.c_str(), model.total(), cluster.name.c_str(), devices,
        cluster.memory_bytes / kGiB, job.name.c_str(), (long long)job.samples(),
        job.tokens_per_step());
    if (job.router_max_over_mean != 1)
      std::printf(
          "# router concentration: the busiest expert takes %.3g x the mean expert's tokens "
          "(job.router_max_over_mean; EP ranks wait for the hottest expert's rank)\n",
          job.router_max_over_mean);
  }
  if (o.table != 0) {
    if (o.table != 1 && o.table != 2) throw ConfigError("--table must be 1 or 2");
    const auto rows =
        o.table == 1
            ? predict_table1(model, config, cluster, job, o.max_redundant_experts, !o.no_rebalance)
            : predict_table2(model, config, cluster, job, o.max_redundant_experts, !o.no_rebalance);
    for (const TableRow& row : rows) {
      if (row.result.best.empty())
        throw ConfigError("plan --table " + std::to_string(o.table) + ": no strategy for '" +
                          row.setting + "' fits in " + gib(cluster.memory_bytes) + " per device");
    }
    print_table(o.table, rows, run.json);
    return 0;
  }
  if (!o.mode.empty()) {
    Strategy s;
    s.mode = parse_mode(o.mode, "--mode");
    s.train = o.train;
    s.generate = o.generate;
    s.staleness = o.staleness;
    s.offload = o.offload;
    s.ep_overlap = o.ep_overlap;
    s.recompute = o.recompute;
    s.redundant_experts = o.redundant_experts;
    s.rebalance = o.rebalance || o.redundant_experts > 0;
    if (o.dispatch != "flat" && o.dispatch != "dedup")
      throw ConfigError("--dispatch must be flat or dedup, got '" + o.dispatch + "'");
    s.dispatch = o.dispatch == "dedup" ? Dispatch::Dedup : Dispatch::Flat;
    const int model_parallel = s.train.tp * s.train.pp;
    if (model_parallel <= 0) throw ConfigError("--train-tp and --train-pp must be >= 1");
    const int train_devices = s.mode == Mode::Disaggregated
                                  ? (s.train.dp > 0 ? s.train.dp * model_parallel : devices / 2)
                                  : devices;
    if (s.train.dp == 0) s.train.dp = train_devices / model_parallel;
    const int generate_devices =
        s.mode == Mode::Disaggregated ? devices - s.train.devices() : s.train.devices();
    if (s.generate.tp <= 0) throw ConfigError("--gen-tp must be >= 1");
    if (s.generate.pp <= 0) throw ConfigError("--gen-pp must be >= 1");
    s.generate.vpp = s.generate.pp > 1 ? s.train.vpp : 1;
    if (s.generate.dp == 0) s.generate.dp = generate_devices / (s.generate.tp * s.generate.pp);
    if (s.devices() > devices || !feasible(config, job, s))
      throw ConfigError("plan: strategy " + s.describe() + " does not fit " +
                        std::to_string(devices) + " devices, model " + config.name + " and job " +
                        job.name +
                        " (degrees must divide heads, experts, TP x DP and the batch; "
                        "rebalancing and redundant experts need training EP, and E / EP + R <= "
                        "E)");
    const Prediction p = predict(model, cluster, job, s);
    print_prediction(s, p, model, cluster, job, run.json);
    return 0;
  }
  SearchSpace space;
  space.devices = devices;
  space.modes.clear();
  for (const std::string& m : split_commas(o.modes))
    space.modes.push_back(parse_mode(m, "--modes"));
  space.staleness = parse_int_list(o.staleness_list, "--staleness-bounds");
  space.max_redundant_experts = o.max_redundant_experts;
  space.rebalance = !o.no_rebalance;
  const SearchResult result = search(model, config, cluster, job, space);
  if (result.best.empty()) {
    throw ConfigError("plan: no strategy fits: " + std::to_string(result.feasible) +
                      " strategies of model " + config.name + " on " + std::to_string(devices) +
                      " devices all need more than the " + gib(cluster.memory_bytes) +
                      " of device memory of " + cluster.name);
  }
  print_ranked(result, run.json);
  return 0;
}

}  // namespace rlf
