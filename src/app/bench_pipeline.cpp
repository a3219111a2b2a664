// `rlfusion bench pipeline`: pipeline parallelism over all ranks (p = world size), 1F1B and
// interleaved 1F1B for several micro-batch counts m and virtual stages v. For each it runs
// training steps of the model cut into p v chunks and reports, per rank, the measured bubble
// (time the rank waited for activations, gradients and the slowest rank, over the step's wall
// time) beside the formula (p - 1) / (m v + p - 1), their ratio, and the schedule's counted
// bubble (idle slots under unit costs) and the bubble simulated with the measured pass times of
// every virtual stage (what the stages' cost imbalance allows). The first step of each row is
// checked against the single-rank model (loss and every gradient: #wrong). --balance counted or
// measured assigns layers to chunks by their counted FLOPs or measured cost
// (src/balance/stage_balance.h, src/app/pipeline_balance.h). Then DistQueue's load per TP x PP
// layout (bench_pipeline_queue.h: one leader per replica against every rank fetching its own
// copy, exactly 1/(T x P) of the requests and bytes). With --pace (default 1.2) every
// row's steps run again with each forward and backward pass spun up to one floor on every rank
// (PassFloor: --pace times the slowest virtual stage's mean pass): equal stages, as the formula
// assumes, so that their measured bubble tests the schedule and the runtime's overhead apart from
// the stages' imbalance (which the unpaced rows and the simulated column show). nccl-tests style:
// '#' header with units, fixed columns, verdict lines and a --json twin.
#include "src/app/bench_pipeline.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/error.h"
#include "kernels/rng.h"
#include "mpi_comm/links.h"
#include "src/app/bench_pipeline_queue.h"
#include "src/app/bench_timing.h"
#include "src/app/build_info.h"
#include "src/app/commands.h"
#include "src/app/integer_list.h"
#include "src/app/options.h"
#include "src/app/pipeline_balance.h"
#include "src/app/stage_layer_costs.h"
#include "src/balance/stage_balance.h"
#include "src/model/activation_memory.h"
#include "src/model/pipeline_stage.h"
#include "src/model/sequence_loss.h"
#include "src/runtime/pipeline_schedule.h"
#include "src/runtime/pipeline_step.h"

namespace rlf {

namespace {

std::vector<int> parse_list(const std::string& text, const std::string& option) {
  std::vector<int> out = parse_integer_list(text, 1, 4096);
  if (out.empty()) {
    throw ConfigError(option + " must be a comma-separated list of integers >= 1, got '" + text +
                      "'");
  }
  return out;
}

// Arithmetic on the options, the model and the world size only: the same error on every rank.
void validate(const PipelineBenchOptions& o, const ModelConfig& model, int world) {
  if (o.repeats < 1) throw ConfigError("--repeats must be >= 1, got " + std::to_string(o.repeats));
  if (o.sequences < 1 || o.length < 2 || o.length > model.max_seq_len) {
    throw ConfigError("--sequences must be >= 1 and --length in [2, " +
                      std::to_string(model.max_seq_len) + "] (the model's max_seq_len)");
  }
  if (!(o.pace == 0 || (o.pace >= 1 && o.pace <= 10))) {
    throw ConfigError("--pace must be 0 (off) or in [1, 10], got " + std::to_string(o.pace));
  }
  if (o.balance != "uniform" && o.balance != "measured" && o.balance != "counted") {
    throw ConfigError("--balance must be uniform, counted or measured, got '" + o.balance + "'");
  }
  if (o.pipeline_parallel < 0) {
    throw ConfigError("--pipeline-parallel must be >= 0 (0: the world size), got " +
                      std::to_string(o.pipeline_parallel));
  }
  const int p = o.pipeline_parallel > 0 ? o.pipeline_parallel : world;
  for (int v : parse_list(o.virtual_stages, "--virtual-stages")) {
    for (int m : parse_list(o.micro_batches, "--micro-batches")) {
      validate_pipeline({p, m, v}, model.n_layers, world, o.balance != "uniform");
    }
  }
}

struct RankStats {
  double wall = 0, compute = 0, wait = 0, in_flight = 0, compute_cpu = 0;
  // The schedule simulated with every stage's measured pass times (rank 0 fills it).
  double simulated = 0;
  // The median paced step (--pace): its wall and wait, and the passes whose work outlasted the
  // floor (each one unevens the stages by its excess).
  double paced_wall = 0, paced_wait = 0, paced_overruns = 0;
};
constexpr int kRankStatsFields = 9;
static_assert(sizeof(RankStats) == kRankStatsFields * sizeof(double));

struct Row {
  int v = 1, m = 1;
  std::vector<int> boundaries;
  std::vector<RankStats> ranks;  // rank 0 only
  double formula = 0, counted = 0;
  // Mean seconds of one forward / backward pass of each virtual stage (p v entries), measured.
  std::vector<double> forward_pass, backward_pass;
  PassFloor floor;  // --pace: every pass's floor (zero: not paced)
  uint64_t wrong = 0;
  double loss = 0;
};

// Elements of the stage's gradients (and the loss) outside 1e-5 + 1e-4 |want| of the
// single-rank model's on the micro-batches of every replica.
uint64_t count_wrong(PipelineStage<float>& stage, const ModelConfig& config, Device& device,
                     const std::vector<PipelineMicroBatch<float>>& batches, double loss,
                     uint64_t seed) {
  ArenaScope scope(device.memory());
  Transformer<float> reference(config, device.ops(), device.memory(), true);
  reference.initialize(seed);
  reference.zero_gradients();
  double want_loss = 0;
  const float aux = config.aux_loss_coef;
  for (const PipelineMicroBatch<float>& b : batches) {
    ArenaScope step(device.memory());
    const int N = b.token_count(), V = config.vocab_size;
    const float* logits = reference.forward(b.tokens.data(), b.seq_offsets.data(), b.sequences());
    float* dlogits = device.memory().allocate_zeroed<float>(size_t(N) * V, "dlogits");
    want_loss += weighted_nll(reference.ops(), device.memory(), logits, b.targets.data(),
                              b.weights.data(), N, V, dlogits);
    want_loss += double(aux) * reference.aux_loss();
    reference.backward(dlogits, aux);
  }
  auto off = [](double got, double want) {
    return !(std::fabs(got - want) <= 1e-5 + 1e-4 * std::fabs(want));
  };
  uint64_t wrong = off(loss, want_loss);
  for (const ParameterTensor& t : stage.model().layout().tensors()) {
    const ParameterTensor* w = reference.layout().find(t.name);
    for (int64_t i = 0; i < t.numel; ++i) {
      wrong += off(stage.model().gradients()[t.offset + i], reference.gradients()[w->offset + i]);
    }
  }
  return wrong;
}

// The repeat of median wall time (its wait and compute belong together, so it is taken whole).
size_t median_index(const std::vector<double>& wall) {
  std::vector<size_t> order(wall.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return wall[a] < wall[b]; });
  return order[order.size() / 2];
}

// One row: p = shape.stages, world / p data-parallel pipelines of consecutive ranks, each on its
// own m micro-batches, gradients summed over them.
Row measure(const PipelineBenchOptions& o, const ModelConfig& config, Device& device,
            const PipelineShape& shape, const std::vector<int>& boundaries, Links& links,
            uint64_t seed) {
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int v = shape.virtual_stages, m = shape.micro_batches;
  const int stage_rank = rank % shape.stages, replica = rank / shape.stages;
  MPI_Comm pipeline, data_parallel;
  MPI_Comm_split(MPI_COMM_WORLD, replica, rank, &pipeline);
  MPI_Comm_split(MPI_COMM_WORLD, stage_rank, rank, &data_parallel);
  Row row;
  row.v = v;
  row.m = m;
  row.boundaries = boundaries;
  row.formula = bubble_formula(shape);
  row.counted = simulate_unit_schedule(shape).bubble_fraction(0);
  const auto all = random_micro_batches(m * (world / shape.stages), o.sequences, o.length,
                                        config.vocab_size, seed);
  const std::vector<PipelineMicroBatch<float>> batches(all.begin() + replica * m,
                                                       all.begin() + (replica + 1) * m);
  // Every arena can hold a whole-model micro-batch: a bound for any chunk (pages untouched
  // beyond what a chunk uses cost nothing).
  const size_t activation_bytes =
      2 * training_micro_batch_peak_bytes(config, ParameterLayout(config),
                                          uniform_batch(o.sequences, o.length + 1));
  ArenaScope scope(device.memory());
  PipelineStage<float> stage(config, device.ops(), device.memory(),
                             pipeline_rank_chunks(shape, stage_rank, boundaries), activation_bytes);
  stage.model().initialize(seed);
  const float aux = config.aux_loss_coef;
  stage.model().zero_gradients();
  const PipelineStepStats first = run_pipeline_step(stage, shape, batches, aux, pipeline, links);
  MPI_Allreduce(MPI_IN_PLACE, stage.model().gradients(), int(stage.model().parameter_count()),
                MPI_FLOAT, MPI_SUM, data_parallel);
  double loss = first.loss;
  MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, data_parallel);
  uint64_t wrong = count_wrong(stage, config, device, all, loss, seed);
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  row.wrong = wrong;
  row.loss = loss;

  std::vector<double> wall, compute, wait, compute_cpu;
  std::vector<std::vector<double>> passes;  // per repeat: forward then backward seconds by chunk
  for (int r = 0; r < o.repeats; ++r) {
    stage.model().zero_gradients();
    const PipelineStepStats s = run_pipeline_step(stage, shape, batches, aux, pipeline, links);
    wall.push_back(s.wall_seconds);
    compute.push_back(s.compute_seconds);
    compute_cpu.push_back(s.compute_cpu_seconds);
    wait.push_back(s.wait_seconds);
    passes.push_back(s.forward_seconds);
    passes.back().insert(passes.back().end(), s.backward_seconds.begin(), s.backward_seconds.end());
  }
  const size_t mid = median_index(wall);
  RankStats mine{wall[mid],        compute[mid], wait[mid], double(stage.activation_arenas()),
                 compute_cpu[mid], 0.0};
  if (o.pace > 0) {
    // One floor for every virtual stage of every pipeline: --pace times the slowest stage's mean
    // pass of the median step.
    double slowest[2] = {0, 0};
    for (int k = 0; k < v; ++k) {
      slowest[0] = std::max(slowest[0], passes[mid][size_t(k)] / m);
      slowest[1] = std::max(slowest[1], passes[mid][size_t(v + k)] / m);
    }
    MPI_Allreduce(MPI_IN_PLACE, slowest, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    row.floor = {o.pace * slowest[0], o.pace * slowest[1]};
    std::vector<double> paced_wall, paced_wait, overruns;
    for (int r = 0; r < o.repeats; ++r) {
      stage.model().zero_gradients();
      const PipelineStepStats s =
          run_pipeline_step(stage, shape, batches, aux, pipeline, links, false, row.floor);
      paced_wall.push_back(s.wall_seconds);
      paced_wait.push_back(s.wait_seconds);
      overruns.push_back(s.floor_overruns);
    }
    const size_t paced_mid = median_index(paced_wall);
    mine.paced_wall = paced_wall[paced_mid];
    mine.paced_wait = paced_wait[paced_mid];
    mine.paced_overruns = overruns[paced_mid];
  }
  row.ranks.resize(size_t(world));
  MPI_Gather(&mine, kRankStatsFields, MPI_DOUBLE, row.ranks.data(), kRankStatsFields, MPI_DOUBLE, 0,
             MPI_COMM_WORLD);
  // Every virtual stage's mean pass time (the median step's, averaged over the data-parallel
  // pipelines), then the schedule simulated with them: the bubble these stage costs allow with
  // messages taking no time. Measured against it, what is left is the runtime's own overhead.
  std::vector<double> all_passes(size_t(world) * 2 * size_t(v));
  MPI_Gather(passes[mid].data(), 2 * v, MPI_DOUBLE, all_passes.data(), 2 * v, MPI_DOUBLE, 0,
             MPI_COMM_WORLD);
  if (rank == 0) {
    const int p = shape.stages, pipelines = world / p;
    row.forward_pass.assign(size_t(shape.chunks()), 0.0);
    row.backward_pass.assign(size_t(shape.chunks()), 0.0);
    for (int r = 0; r < world; ++r) {
      for (int k = 0; k < v; ++k) {
        const size_t s = size_t(virtual_stage(shape, r % p, k));
        const double* mine_passes = all_passes.data() + size_t(r) * 2 * size_t(v);
        row.forward_pass[s] += mine_passes[k] / (double(m) * pipelines);
        row.backward_pass[s] += mine_passes[v + k] / (double(m) * pipelines);
      }
    }
    std::vector<std::vector<PipelineOp>> schedules;
    for (int r = 0; r < p; ++r) schedules.push_back(pipeline_schedule(shape, r));
    const ScheduleTiming simulated =
        simulate_schedule(shape, schedules, row.forward_pass, row.backward_pass);
    for (int r = 0; r < world; ++r)
      row.ranks[size_t(r)].simulated = simulated.bubble_fraction(r % p);
  }
  MPI_Comm_free(&pipeline);
  MPI_Comm_free(&data_parallel);
  return row;
}

std::string join(const std::vector<int>& values) {
  std::string out;
  for (int v : values) {
    if (!out.empty()) out += ',';
    out += std::to_string(v);
  }
  return out;
}

std::string join(const std::vector<double>& seconds) {
  std::string out;
  char number[32];
  for (double s : seconds) {
    std::snprintf(number, sizeof number, "%s%.6e", out.empty() ? "" : ",", s);
    out += number;
  }
  return out;
}

}  // namespace

int run_bench_pipeline_command(const std::vector<std::string>& args) {
  RunOptions run;
  PipelineBenchOptions o;
  po::options_description description = run_options_description(run);
  po::options_description bench("bench pipeline options");
  auto add = bench.add_options();
  add("pipeline-parallel", po::value(&o.pipeline_parallel)->default_value(o.pipeline_parallel),
      "pipeline stages p (0: the world size); world / p data-parallel pipelines");
  add("micro-batches", po::value(&o.micro_batches)->default_value(o.micro_batches),
      "micro-batch counts m per step, comma-separated (interleaved: multiples of the ranks)");
  add("virtual-stages", po::value(&o.virtual_stages)->default_value(o.virtual_stages),
      "virtual stages v per rank, comma-separated (1: 1F1B; > 1: interleaved 1F1B)");
  add("layers", po::value(&o.layers)->default_value(o.layers),
      "the model's layers (0: as in the model file); ranks x v must divide them");
  add("sequences", po::value(&o.sequences)->default_value(o.sequences),
      "sequences per micro-batch");
  add("length", po::value(&o.length)->default_value(o.length), "tokens per sequence");
  add("balance", po::value(&o.balance)->default_value(o.balance),
      "layers per chunk: uniform, counted (stage balancing by counted per-layer FLOPs) or "
      "measured (by per-layer forward+backward times, each layer's slowest rank)");
  add("pace", po::value(&o.pace)->default_value(o.pace),
      "> 0: every row's steps again with each pass paced to PACE x the slowest virtual stage's "
      "mean pass (equal stages, as the formula assumes; spinning); 0: off");
  add("repeats", po::value(&o.repeats)->default_value(o.repeats),
      "timed steps per row after a checked one (the median step is reported)");
  add("expert-parallel", po::value(&o.expert_parallel)->default_value(o.expert_parallel),
      "EP degree inside every stage (> 1: PP x EP rows, each step run plain, with "
      "--ep-overlap-chunks and with --pipeline-pairing on the same data, their hidden fractions "
      "and the ratios)");
  add("ep-overlap-chunks", po::value(&o.overlap_chunks)->default_value(o.overlap_chunks),
      "with --expert-parallel: overlap chunks per MoE layer in the overlapped run (>= 2)");
  add("inter-node-bandwidth",
      po::value(&o.inter_node_bandwidth)->default_value(o.inter_node_bandwidth),
      "with --expert-parallel: bytes/s of the emulated links, every rank its own node (0: none)");
  add("queue-layouts", po::value(&o.queue_layouts)->default_value(o.queue_layouts),
      "DistQueue load per layout: TxP list (tensor x pipeline degrees; by default those whose "
      "T x P divides the world size), or none");
  add("queue-samples", po::value(&o.queue_samples)->default_value(o.queue_samples),
      "the queue part's rollouts per step (a multiple of the world size)");
  add("queue-shards", po::value(&o.queue_shards)->default_value(o.queue_shards),
      "the queue part's DistQueue shards");
  description.add(bench);
  if (!parse_options("bench pipeline", args, description, run)) return 0;

  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ModelConfig config = load_model_config(run.model);
  if (o.layers < 0) throw ConfigError("--layers must be >= 0, got " + std::to_string(o.layers));
  if (o.layers > 0) config.n_layers = o.layers;
  config.validate("--model " + run.model + " --layers " + std::to_string(config.n_layers));
  validate(o, config, world);
  validate_pipeline_overlap_options(o, config, world);
  const std::vector<QueueLayout> queue_layouts = parse_queue_layouts(
      o.queue_layouts, world, o.queue_layouts == PipelineBenchOptions{}.queue_layouts);
  const QueueLoadOptions queue_options{o.queue_samples, o.queue_shards, o.repeats, run.seed};
  validate_queue_load(queue_options, queue_layouts, world);
  // The queue's table after the pipeline's (either kind of rows); a layout that is not exact or
  // delivered wrong samples fails the run like a wrong gradient.
  auto queue_part = [&](uint64_t wrong) {
    const int bad = print_queue_load(
        queue_options, measure_queue_load(queue_options, queue_layouts), world, run.json);
    return wrong || bad ? 1 : 0;
  };
  const std::vector<int> vs = parse_list(o.virtual_stages, "--virtual-stages");
  const std::vector<int> ms = parse_list(o.micro_batches, "--micro-batches");
  const int p = o.pipeline_parallel > 0 ? o.pipeline_parallel : world;
  Device device(run.backend_kind(), run.device_memory_bytes(), resolve_threads(run.threads));
  if (o.expert_parallel > 1) {
    return queue_part(run_pipeline_overlap_rows(o, config, device, vs, ms, run.seed, run.json));
  }
  Links links(std::vector<int>(size_t(world), 0), {});  // one node: no emulation
  double load[1] = {-1};
  if (getloadavg(load, 1) != 1) load[0] = -1;

  // Stage balancing: the same costs on every rank (measured: each layer's slowest rank).
  const LayerCosts costs = o.balance == "uniform"
                               ? LayerCosts{}
                               : agreed_layer_costs(o.balance, config, device, o.sequences,
                                                    o.length, run.seed, MPI_COMM_WORLD);

  std::vector<Row> rows;
  for (int v : vs) {
    const int chunks = p * v;
    const std::vector<int> boundaries = o.balance == "uniform"
                                            ? uniform_boundaries(config.n_layers, chunks)
                                            : balance_boundaries(costs, chunks);
    for (int m : ms) {
      rows.push_back(measure(o, config, device, {p, m, v}, boundaries, links, run.seed));
    }
  }

  const std::string cpus = cpu_lists_of_ranks();
  uint64_t wrong = 0;
  for (const Row& r : rows) wrong += r.wrong;
  if (rank == 0) {
    std::printf("# rlfusion bench pipeline: %s\n", build_info().c_str());
    std::printf(
        "# %d ranks = PP %d x DP %d; model %s with %d layers (d_model %d, %d experts top-%d); "
        "micro-batch = %d x %d tokens; layers per chunk: %s\n",
        world, p, world / p, config.name.c_str(), config.n_layers, config.d_model, config.n_experts,
        config.top_k, o.sequences, o.length, o.balance.c_str());
    if (o.balance == "measured") {
      std::printf("# measured forward+backward per layer, slowest rank (ms):");
      for (double s : costs.layer) std::printf(" %.2f", s * 1e3);
      std::printf("\n");
    } else if (o.balance == "counted") {
      std::printf("# counted forward+backward per layer (MFLOP):");
      for (double f : costs.layer) std::printf(" %.1f", f * 1e-6);
      std::printf("; the head %.1f MFLOP more on the last\n", costs.last_extra * 1e-6);
    }
    std::printf("# each rank: %s; CPUs of rank r:", device.describe().c_str());
    std::printf("%s", cpus.c_str());
    std::printf(
        "\n# 1-minute load average at start: %.2f on %ld CPUs. Times need one idle core per "
        "rank: under load (other processes) waits and compute stretch and the measured bubble "
        "is not the schedule's\n",
        load[0], sysconf(_SC_NPROCESSORS_ONLN));
    std::printf(
        "# measured bubble = wait / wall of the median of %d steps, wait = time blocked on "
        "activations, gradients and the slowest rank; formula = (p-1)/(m v + p-1); counted = "
        "idle slots / makespan of the schedule under unit costs\n#\n",
        o.repeats);
    std::printf(
        "# compute cpu = the process's CPU time in the same passes: well below compute, the rank "
        "lost its core; apart between ranks, their chunks cost differently\n");
    std::printf(
        "# simulated = the bubble of the same schedule with every virtual stage's measured mean "
        "forward and backward pass times and messages taking no time: apart from formula, the "
        "stages cost differently; measured apart from simulated, the runtime's own overhead "
        "(messages, wake-ups)\n#\n");
    if (o.pace > 0) {
      std::printf(
          "# paced = the bubble of the same steps with every pass spun up to one floor (--pace "
          "%.2f x the slowest virtual stage's mean forward, and backward): equal stages, as the "
          "formula assumes; apart from formula, the schedule's and the runtime's own; overruns = "
          "passes whose work outlasted the floor (the floors in ms follow each row's table)\n#\n",
          o.pace);
    }
    std::printf(
        "# %-16s %2s %3s %-12s %4s %9s %9s %9s %9s %8s %8s %6s %9s %8s %9s %7s %8s %6s %7s\n",
        "schedule", "v", "m", "chunks", "rank", "wall", "compute", "cpu", "wait", "bubble",
        "formula", "ratio", "simulated", "counted", "in-flight", "#wrong", "paced", "ratio",
        "overrun");
    std::printf(
        "# %-16s %2s %3s %-12s %4s %9s %9s %9s %9s %8s %8s %6s %9s %8s %9s %7s %8s %6s %7s\n", "",
        "", "", "(layers)", "", "(ms)", "(ms)", "(ms)", "(ms)", "(%)", "(%)", "(x)", "(%)", "(%)",
        "(chunks)", "", "(%)", "(x)", "(passes)");
    for (const Row& row : rows) {
      const std::string name = schedule_name({p, row.m, row.v});
      for (int r = 0; r < world; ++r) {
        const RankStats& s = row.ranks[size_t(r)];
        const double bubble = s.wall > 0 ? s.wait / s.wall : 0;
        const double paced = s.paced_wall > 0 ? s.paced_wait / s.paced_wall : 0;
        std::printf(
            "  %-16s %2d %3d %-12s %4d %9.2f %9.2f %9.2f %9.2f %8.1f %8.1f %6.2f %9.1f %8.1f "
            "%9.0f %7llu %8.1f %6.2f %7.0f\n",
            name.c_str(), row.v, row.m, join(row.boundaries).c_str(), r, s.wall * 1e3,
            s.compute * 1e3, s.compute_cpu * 1e3, s.wait * 1e3, 100 * bubble, 100 * row.formula,
            row.formula > 0 ? bubble / row.formula : 0, 100 * s.simulated, 100 * row.counted,
            s.in_flight, (unsigned long long)row.wrong, 100 * paced,
            row.formula > 0 ? paced / row.formula : 0, s.paced_overruns);
      }
      if (row.floor.any()) {
        std::printf("#   paced floors: forward %.3f ms, backward %.3f ms a pass\n",
                    row.floor.forward * 1e3, row.floor.backward * 1e3);
      }
    }
    std::printf("#\n# Pipeline vs single-rank model (loss and gradients) : %llu wrong %s\n",
                (unsigned long long)wrong, wrong ? "FAIL" : "OK");
    double worst = 0, worst_simulated = 0, worst_stages = 0, worst_paced = 0, overruns = 0;
    for (const Row& row : rows) {
      for (const RankStats& s : row.ranks) {
        if (row.formula > 0 && s.wall > 0) {
          worst = std::max(worst, std::fabs(s.wait / s.wall / row.formula - 1));
          worst_stages = std::max(worst_stages, std::fabs(s.simulated / row.formula - 1));
        }
        if (row.formula > 0 && s.paced_wall > 0) {
          worst_paced =
              std::max(worst_paced, std::fabs(s.paced_wait / s.paced_wall / row.formula - 1));
          overruns += s.paced_overruns;
        }
        if (s.simulated > 0 && s.wall > 0) {
          worst_simulated = std::max(worst_simulated, std::fabs(s.wait / s.wall / s.simulated - 1));
        }
      }
    }
    std::printf(
        "# Measured bubble vs formula: worst |ratio - 1| = %.0f%% (goal <= 10%% on idle cores; "
        "the counted bubble equals the formula exactly)\n",
        100 * worst);
    std::printf(
        "# Simulated with the measured pass times vs formula: worst |ratio - 1| = %.0f%% (the "
        "stages' cost imbalance); measured vs simulated: worst |ratio - 1| = %.0f%% (the "
        "runtime's overhead)\n",
        100 * worst_stages, 100 * worst_simulated);
    if (o.pace > 0) {
      std::printf(
          "# Paced (equal stages) vs formula: worst |ratio - 1| = %.0f%% (goal <= 10%% on idle "
          "cores), %.0f passes over their floor in the median steps\n",
          100 * worst_paced, overruns);
    }
  }
  if (run.json && rank == 0) {
    std::printf(
        "{\"bench\":\"pipeline\",\"ranks\":%d,\"pipeline_parallel\":%d,\"model\":\"%s\",\"layers\":"
        "%d,\"sequences\":%d,"
        "\"length\":%d,\"balance\":\"%s\",\"load_average\":%.2f,\"rows\":[",
        world, p, config.name.c_str(), config.n_layers, o.sequences, o.length, o.balance.c_str(),
        load[0]);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& row = rows[i];
      std::printf(
          "%s{\"virtual_stages\":%d,\"micro_batches\":%d,\"boundaries\":[%s],\"formula\":%.6f,"
          "\"counted\":%.6f,\"loss\":%.8g,\"wrong\":%llu,\"forward_pass_seconds\":[%s],"
          "\"backward_pass_seconds\":[%s],\"paced_floor_seconds\":[%.6e,%.6e],\"ranks\":[",
          i ? "," : "", row.v, row.m, join(row.boundaries).c_str(), row.formula, row.counted,
          row.loss, (unsigned long long)row.wrong, join(row.forward_pass).c_str(),
          join(row.backward_pass).c_str(), row.floor.forward, row.floor.backward);
      for (int r = 0; r < world; ++r) {
        const RankStats& s = row.ranks[size_t(r)];
        std::printf(
            "%s{\"rank\":%d,\"wall_seconds\":%.6e,\"compute_seconds\":%.6e,"
            "\"compute_cpu_seconds\":%.6e,\"wait_seconds\":%.6e,\"bubble\":%.6f,"
            "\"simulated_bubble\":%.6f,\"in_flight\":%.0f,\"paced_wall_seconds\":%.6e,"
            "\"paced_wait_seconds\":%.6e,\"paced_bubble\":%.6f,\"paced_overruns\":%.0f}",
            r ? "," : "", r, s.wall, s.compute, s.compute_cpu, s.wait,
            s.wall > 0 ? s.wait / s.wall : 0, s.simulated, s.in_flight, s.paced_wall, s.paced_wait,
            s.paced_wall > 0 ? s.paced_wait / s.paced_wall : 0, s.paced_overruns);
      }
      std::printf("]}");
    }
    std::printf("],\"wrong\":%llu}\n", (unsigned long long)wrong);
  }
  return queue_part(wrong);
}

}  // namespace rlf
