// `rlfusion bench rebalance`: the step-time effect of EDPB rebalancing in expert-parallel
// training. EP = the world; the same skewed model (--router-skew: the hot experts start on EP
// rank 0) trains the same synthetic batches twice, first with the experts where they start, then
// with the rebalancer of `train --rebalance-every` (src/app/train_rebalance.h) moving them live.
// Printed: step time of the slowest rank, max/mean EP-rank load (tokens routed to each rank's
// experts, the busiest rank of each layer summed over layers), migrations, and whether both runs
// end with bit-identical weights (they must: no replicas). Times need one idle core per rank
// (`mpiexec --bind-to core`, --threads 1). `--mode fused`: every step first generates from the
// batch's prompts on the same ranks and placement (RL Fusion without a layout switch: the router
// statistics and the step time include generation; the generated samples must match too);
// `--ep-overlap-chunks C`: training's experts in C overlapped chunks, migrated with the rest.
// `--redundant-experts R` (training only): a third run whose rebalancer also replicates hot
// experts into R spare slots per rank; its weights must stay within float rounding of the
// static run's (the replicas' gradient sum adds in another order).
#include <mpi.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
#include "src/app/train_rebalance.h"
#include "src/balance/expert_placement.h"
#include "src/model/generation.h"
#include "src/rl/rl_step.h"
#include "src/rl/tokenizer.h"

namespace rlf {

namespace {

using Clock = std::chrono::steady_clock;

struct RebalanceBenchOptions {
  int steps = 16, sequences = 8, length = 48;
  bool verbose = false;  // print every migration's log line
  float learning_rate = 1e-4f;
  bool fused = false;        // --mode fused: generate before every training step
  int generate_tokens = 16;  // new tokens per sample in fused mode
  int overlap_chunks = 1;    // --ep-overlap-chunks
  RebalanceOptions rebalance;
};

// This rank's synthetic samples of step `step`: a 4-token prompt and a response of random
// characters, behaviour log-prob -2 per token, advantages +-1; a pure function of (seed, step,
// rank), so both runs train on the same data.
std::vector<Rollout> synthetic_batch(const RebalanceBenchOptions& o, uint64_t seed, int step,
                                     int rank, int vocab) {
  std::vector<Rollout> batch(static_cast<size_t>(o.sequences));
  const int first_character = 3;  // after <pad>, <bos>, <eos>
  for (int i = 0; i < o.sequences; ++i) {
    Rollout& r = batch[size_t(i)];
    r.sample_id = (int64_t(step) * 4096 + rank) * o.sequences + i;
    const uint64_t stream = uint64_t(r.sample_id);
    auto token = [&](int position) {
      return first_character +
             int(philox_uniform(seed, stream, uint64_t(position)) * float(vocab - first_character));
    };
    r.prompt = {1, token(0), token(1), token(2)};
    for (int t = 0; t < o.length - 4; ++t) r.response.push_back(token(10 + t));
    r.behaviour_logp.assign(r.response.size(), -2.0f);
    r.advantage = philox_uniform(seed, stream, 1u << 20) < 0.5f ? -1.0 : 1.0;
  }
  return batch;
}

struct RunResult {
  std::vector<double> step_seconds;  // training + any migration, slowest rank
  std::vector<double> load_ratio;    // max/mean EP-rank load per step
  // Per step: tokens routed to each (layer, expert), over every rank: the routing's fingerprint.
  std::vector<std::vector<double>> expert_tokens;
  int migrations = 0, first_decision = 0;
  int replicated = 0;            // (layer, expert) pairs with more than one replica at the end
  std::vector<float> weights;    // the whole model, gathered on rank 0
  std::vector<float> generated;  // fused: this rank's generated tokens and log-probs
};

// Fused mode's generation phase: `generate_tokens` sampled tokens after each prompt of `batch`;
// appends the tokens and their log-probs to `out` (bit-compared between the runs).
void generate_from(Transformer<float>& model, const std::vector<Rollout>& batch,
                   const RebalanceBenchOptions& o, uint64_t seed, std::vector<float>& out) {
  std::vector<std::vector<int>> prompts;
  std::vector<int64_t> ids;
  for (const Rollout& r : batch) {
    prompts.push_back(r.prompt);
    ids.push_back(r.sample_id);
  }
  GenerationSettings settings;
  settings.max_new_tokens = o.generate_tokens;
  settings.seed = seed;
  for (const GeneratedSample& sample : generate(model, prompts, ids, settings)) {
    out.insert(out.end(), sample.tokens.begin(), sample.tokens.end());
    out.insert(out.end(), sample.logprobs.begin(), sample.logprobs.end());
  }
}

// `redundant` spare expert slots per rank (replicas of hot experts, placed by the rebalancer).
RunResult train_run(const RebalanceBenchOptions& o, bool rebalance, int redundant,
                    const RunOptions& run, const ModelConfig& config, Device& device,
                    HierarchicalComm& world, Links& links) {
  const int size = world.size(), E = config.n_experts;
  const Arena::Mark mark = device.memory().mark();
  RunResult result;
  {
    RoleExpertParallel ep(world, links, E, size, DispatchMode::Flat, redundant);
    Transformer<float> model(config, device.ops(), device.memory(), true, ep.shard());
    model.initialize(run.seed);
    AdamWHyper hyper;
    hyper.learning_rate = o.learning_rate;
    AdamW<float> optimizer(model, hyper, 1.0f);
    ep.attach(model, o.overlap_chunks);
    ep.fill_redundant_slots(model.parameters(), model.layout());
    optimizer.set_shard(ep.optimizer_shard(model.layout()));
    DataParallelHooks hooks;
    hooks.sum = [](double x) {
      MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      return x;
    };
    hooks.reduce_gradients = [&] { ep.reduce_gradients(model.gradients(), model.layout()); };
    RebalanceOptions settings = o.rebalance;
    if (!rebalance) settings.every = 0;
    TraceRecorder trace(MPI_COMM_WORLD);  // the router statistics of every step
    TrainRebalancer rebalancer(settings, ep, world, model, optimizer, nullptr, trace);
    RlStepSettings step_settings;
    step_settings.group_size = 1;
    step_settings.micro_batch = o.sequences;
    for (int step = 1; step <= o.steps; ++step) {
      const std::vector<Rollout> batch =
          synthetic_batch(o, run.seed, step, world.rank(), config.vocab_size);
      const std::vector<std::vector<int>> slots = ep.slot_experts();  // this step's placement
      MPI_Barrier(MPI_COMM_WORLD);
      const auto start = Clock::now();
      if (o.fused) generate_from(model, batch, o, run.seed, result.generated);
      optimize_on_rollouts(model, optimizer, batch, step_settings, hooks);
      // Generation's tokens are counted too in fused mode: its seconds go with them.
      const double routed = std::chrono::duration<double>(Clock::now() - start).count();
      const std::string migrated = rebalancer.end_of_step(step, routed);
      if (world.rank() == 0 && o.verbose) std::fputs(migrated.c_str(), stdout);
      result.step_seconds.push_back(
          max_over_world(std::chrono::duration<double>(Clock::now() - start).count()));
      // Tokens routed to each EP rank's experts during the step, over every rank's tokens, layer
      // by layer (each layer's exchange waits for its busiest rank): the busiest ranks' tokens
      // summed over layers, over the mean rank's. A replicated expert's tokens count evenly
      // split over its replicas (the dispatcher splits each rank's within one of even).
      const int L = config.n_layers;
      std::vector<double> per_expert(size_t(L) * E, 0.0);
      for (const RouterLoad& l : trace.router_loads()) {
        if (l.step == step) per_expert[size_t(l.layer) * E + size_t(l.expert)] += double(l.tokens);
      }
      MPI_Allreduce(MPI_IN_PLACE, per_expert.data(), L * E, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      result.expert_tokens.push_back(per_expert);
      double busiest = 0, mean = 0;
      for (int layer = 0; layer < L; ++layer) {
        Placement placed;
        placed.cluster = {1, size, ep.local_slots()};
        placed.experts = E;
        placed.slot_expert = slots[size_t(layer)];
        const std::vector<double> per_rank = placed.device_loads(std::vector<double>(
            per_expert.begin() + int64_t(layer) * E, per_expert.begin() + int64_t(layer + 1) * E));
        busiest += max_of(per_rank);
        mean += mean_of(per_rank);
      }
      result.load_ratio.push_back(busiest / mean);
    }
    result.migrations = rebalancer.migrations();
    result.replicated = ep.replicated_experts();
    const ParameterLayout full(config);
    result.weights.assign(world.rank() == 0 ? size_t(full.total()) : 0, 0.0f);
    ep.gather_full_model(model.parameters(), model.layout(), result.weights.data(), full);
  }
  device.memory().release(mark);
  return result;
}

// The first step (1-based) at which the two runs routed differently (tokens per expert), 0 when
// they never did.
int first_routing_difference(const RunResult& a, const RunResult& b) {
  for (size_t step = 0; step < std::min(a.expert_tokens.size(), b.expert_tokens.size()); ++step) {
    if (a.expert_tokens[step] != b.expert_tokens[step]) return int(step) + 1;
  }
  return 0;
}

double mean_from(const std::vector<double>& values, size_t first) {
  double sum = 0;
  for (size_t i = first; i < values.size(); ++i) sum += values[i];
  return values.size() > first ? sum / double(values.size() - first) : 0.0;
}

}  // namespace

int run_bench_rebalance_command(const std::vector<std::string>& args) {
  RunOptions run;
  run.model = "small";
  RebalanceBenchOptions o;
  o.rebalance.every = 2;
  o.rebalance.router_skew = 4.0f;
  po::options_description description = run_options_description(run);
  po::options_description bench("bench rebalance options");
  auto add = bench.add_options();
  add("steps", po::value(&o.steps)->default_value(o.steps), "training steps per run");
  add("sequences", po::value(&o.sequences)->default_value(o.sequences),
      "sequences per rank and step");
  add("length", po::value(&o.length)->default_value(o.length), "tokens per sequence (>= 5)");
  add("verbose", po::bool_switch(&o.verbose), "print every migration as `train` logs it");
  add("learning-rate", po::value(&o.learning_rate)->default_value(o.learning_rate),
      "AdamW learning rate (the larger, the faster the routing drifts between decisions)");
  std::string mode = "disaggregated";
  add("mode", po::value(&mode)->default_value(mode),
      "disaggregated: the learners' training alone; fused: every step first generates from its "
      "prompts on the same ranks and expert placement");
  add("generate-tokens", po::value(&o.generate_tokens)->default_value(o.generate_tokens),
      "--mode fused: new tokens per sample");
  add("ep-overlap-chunks", po::value(&o.overlap_chunks)->default_value(o.overlap_chunks),
      "training's routed experts in this many chunks, transfers overlapped with the expert FFN");
  description.add(bench);
  description.add(rebalance_options_description(o.rebalance));
  if (!parse_options("bench rebalance", args, description, run)) return 0;
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (o.steps < 1 || o.sequences < 1 || o.length < 5) {
    throw ConfigError("--steps and --sequences must be >= 1 and --length >= 5");
  }
  if (!(o.learning_rate >= 0) || !std::isfinite(o.learning_rate)) {
    throw ConfigError("--learning-rate must be a finite number >= 0");
  }
  if (o.rebalance.every < 1) {
    throw ConfigError("bench rebalance: --rebalance-every must be >= 1 (the run to compare)");
  }
  if (mode != "disaggregated" && mode != "fused") {
    throw ConfigError("bench rebalance: --mode must be 'disaggregated' or 'fused', got '" + mode +
                      "'");
  }
  o.fused = mode == "fused";
  if (o.overlap_chunks < 1 || o.generate_tokens < 1) {
    throw ConfigError("bench rebalance: --ep-overlap-chunks and --generate-tokens must be >= 1");
  }
  validate(o.rebalance, size);
  const int redundant = o.rebalance.redundant_experts;
  if (redundant > 0 && (o.fused || o.overlap_chunks > 1)) {
    throw ConfigError(
        "bench rebalance: --redundant-experts runs training only (no --mode fused or "
        "--ep-overlap-chunks > 1)");
  }
  ModelConfig config = load_model_config(run.model);
  config.router_skew = o.rebalance.router_skew;
  if (o.length > config.max_seq_len || (o.fused && 4 + o.generate_tokens > config.max_seq_len)) {
    throw ConfigError("--length and 4 + --generate-tokens must be <= the model's max_seq_len " +
                      std::to_string(config.max_seq_len));
  }
  if (config.n_experts % size != 0) {
    throw ConfigError("bench rebalance: the world (" + std::to_string(size) +
                      " ranks) must divide the model's " + std::to_string(config.n_experts) +
                      " experts");
  }
  if (redundant > 0)
    validate_redundant_slots(redundant, config.n_experts, size, "--redundant-experts");
  Links links(std::vector<int>(size_t(size), 0), LinkEmulation{});
  HierarchicalComm world = make_hierarchical(MPI_COMM_WORLD, links);
  Device device(Backend::Cpu, run.device_memory_bytes(), resolve_threads(run.threads));
  const RunResult still = train_run(o, false, 0, run, config, device, world, links);
  const RunResult moved = train_run(o, true, 0, run, config, device, world, links);
  // With replicas the gradient sums add in another order: the weights agree within rounding.
  const RunResult replicas = redundant > 0
                                 ? train_run(o, true, redundant, run, config, device, world, links)
                                 : RunResult{};
  free_hierarchical(world);

  // Compared from the first step after the first decision on (both runs, the same steps).
  const size_t from = size_t(std::min(o.rebalance.every, o.steps - 1));
  const double still_s = mean_from(still.step_seconds, from);
  const double moved_s = mean_from(moved.step_seconds, from);
  // [weights, generated samples] equal on every rank.
  int same[2] = {rank != 0 || still.weights == moved.weights ? 1 : 0,
                 still.generated == moved.generated ? 1 : 0};
  MPI_Allreduce(MPI_IN_PLACE, same, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  double replica_error = 0, largest = 0;
  if (rank == 0 && redundant > 0) {
    for (size_t i = 0; i < still.weights.size(); ++i) {
      replica_error =
          std::max(replica_error, double(std::fabs(replicas.weights[i] - still.weights[i])));
      largest = std::max(largest, double(std::fabs(still.weights[i])));
    }
    replica_error /= std::max(largest, 1e-30);
  }
  constexpr double kReplicaTolerance = 1e-4;  // of the largest weight
  // Rounding differences can flip a token's top-k choice; from then on the runs train different
  // routings and their weights part by far more than rounding (EP 4, skew 8: 2.7e-4 at learning
  // rate 1e-4 with the routing parted, 6e-8 at 1e-5 with the same routing). The weights are
  // compared only while the routing stayed the same; the MPI tests compare the math step by step.
  const int routing_parted = redundant > 0 ? first_routing_difference(still, replicas) : 0;
  int replicas_close =
      rank != 0 || routing_parted > 0 || replica_error <= kReplicaTolerance ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &replicas_close, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  const int all_same = same[0] && same[1] && replicas_close ? 1 : 0;
  if (rank == 0) {
    double load[1] = {-1};
    getloadavg(load, 1);
    std::printf("# rlfusion bench rebalance: %s\n", build_info().c_str());
    std::printf(
        "# EP %d (the world), model %s (%d experts, %d layers, top-%d), router skew %g; %d steps "
        "of %d sequences x %d tokens per rank, the same in both runs, learning rate %g; "
        "rebalance every %d steps, horizon %d, min gain %g; %s, training's experts in %d overlap "
        "chunk(s); step time (%straining + migration, slowest rank) and load: "
        "mean over steps %zu-%d; load average %.2f at the end (times need one idle core per "
        "rank)\n#\n",
        size, config.name.c_str(), config.n_experts, config.n_layers, config.top_k,
        double(o.rebalance.router_skew), o.steps, o.sequences, o.length, double(o.learning_rate),
        o.rebalance.every, o.rebalance.horizon, o.rebalance.min_gain_ratio,
        o.fused ? "fused (every step generates first)" : "training only", o.overlap_chunks,
        o.fused ? "generation + " : "", from + 1, o.steps, load[0]);
    std::printf("# %-11s %12s %14s %11s\n", "run", "step time", "EP-rank load", "migrations");
    std::printf("# %-11s %12s %14s %11s\n", "", "(ms)", "(max/mean)", "");
    for (const auto& [name, r] : {std::pair<const char*, const RunResult&>{"static", still},
                                  std::pair<const char*, const RunResult&>{"rebalanced", moved}}) {
      std::printf("  %-11s %12.2f %14.3f %11d\n", name, mean_from(r.step_seconds, from) * 1e3,
                  mean_from(r.load_ratio, from), r.migrations);
    }
    if (redundant > 0) {
      std::printf(
          "  %-11s %12.2f %14.3f %11d   (%d redundant slot(s) per rank; %d (layer, "
          "expert) pairs replicated at the end)\n",
          "replicas", mean_from(replicas.step_seconds, from) * 1e3,
          mean_from(replicas.load_ratio, from), replicas.migrations, redundant,
          replicas.replicated);
    }
    std::printf("#\n# Final weights bit-identical            : %s\n", same[0] ? "OK" : "FAIL");
    if (o.fused) {
      std::printf("# Generated samples bit-identical        : %s\n", same[1] ? "OK" : "FAIL");
    }
    if (redundant > 0 && routing_parted > 0) {
      std::printf(
          "# Final weights with replicas vs static : %.2e of the largest weight, not compared: "
          "the replicas run routed differently from step %d on (rounding flipped a top-k choice; "
          "a smaller --learning-rate keeps the routing)\n",
          replica_error, routing_parted);
    } else if (redundant > 0) {
      std::printf(
          "# Final weights with replicas vs static : %.2e of the largest weight (<= %g) %s\n",
          replica_error, kReplicaTolerance, replicas_close ? "OK" : "FAIL");
    }
    std::printf("# Step time static/rebalanced           : %.3fx %s\n", still_s / moved_s,
                still_s > moved_s ? "faster" : "NOT FASTER");
    if (run.json) {
      std::printf(
          "{\"bench\":\"rebalance\",\"ranks\":%d,\"model\":\"%s\",\"mode\":\"%s\","
          "\"ep_overlap_chunks\":%d,\"router_skew\":%g,\"steps\":%d,"
          "\"rebalance_every\":%d,\"static_step_seconds\":%.6e,\"rebalanced_step_seconds\":%.6e,"
          "\"static_load_max_over_mean\":%.4f,\"rebalanced_load_max_over_mean\":%.4f,"
          "\"migrations\":%d,\"bit_identical\":%d,\"speedup\":%.4f,\"redundant_experts\":%d,"
          "\"replicas_load_max_over_mean\":%.4f,\"replicas_migrations\":%d,"
          "\"replicated_experts\":%d,\"replicas_weight_error\":%.3e,"
          "\"replicas_routing_parted_step\":%d}\n",
          size, config.name.c_str(), o.fused ? "fused" : "disaggregated", o.overlap_chunks,
          double(o.rebalance.router_skew), o.steps, o.rebalance.every, still_s, moved_s,
          mean_from(still.load_ratio, from), mean_from(moved.load_ratio, from), moved.migrations,
          same[0] && same[1] ? 1 : 0, still_s / moved_s, redundant,
          redundant > 0 ? mean_from(replicas.load_ratio, from) : 0.0, replicas.migrations,
          replicas.replicated, replica_error, routing_parted);
    }
  }
  return all_same ? 0 : 1;
}

}  // namespace rlf
