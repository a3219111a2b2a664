// `rlfusion bench pipeline --expert-parallel E`: PP x EP rows. Every row runs the schedule's step
// on the same weights and micro-batches four times per repeat, interleaved: plain (every MoE
// layer's dispatch and combine blocking), overlapped (--ep-overlap-chunks C: the routed experts in
// C chunks whose exchanges overlap the expert FFN, OverlappedExperts per micro-batch chunk in
// flight), paired (--pipeline-pairing: the schedule's forward / backward pairs with their MoE
// exchanges interleaved, src/model/pass_pair.h) and both (paired, with the overlap chunks). Per
// rank: each run's wall time, its EP communication time in flight and the part of it that held
// the rank up (exposed), the hidden fraction 1 - exposed / in flight of each, and the share of the
// plain run's communication time the overlap took off the rank's exposed time (the measure of
// `bench overlap`). The overlapped gradients are checked against the plain ones within float
// tolerance, the paired ones bit for bit, and both's bit for bit against the overlapped ones.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/error.h"
#include "mpi_comm/expert_dispatch.h"
#include "src/app/bench_pipeline.h"
#include "src/app/bench_timing.h"
#include "src/app/build_info.h"
#include "src/app/stage_layer_costs.h"
#include "src/model/activation_memory.h"
#include "src/model/overlapped_experts.h"
#include "src/runtime/pipeline_groups.h"
#include "src/runtime/pipeline_step.h"
#include "src/runtime/role_expert_parallel.h"

namespace rlf {

void validate_pipeline_overlap_options(const PipelineBenchOptions& o, const ModelConfig& config,
                                       int world) {
  if (o.expert_parallel < 1) {
    throw ConfigError("--expert-parallel must be >= 1, got " + std::to_string(o.expert_parallel));
  }
  if (o.expert_parallel == 1) return;
  const int p = o.pipeline_parallel > 0 ? o.pipeline_parallel : world;
  const int pipelines = world / p;
  if (pipelines % o.expert_parallel != 0 || config.n_experts % o.expert_parallel != 0) {
    throw ConfigError("--expert-parallel " + std::to_string(o.expert_parallel) +
                      " must divide both the " + std::to_string(pipelines) +
                      " pipelines (an EP group is one stage's ranks in E pipelines) and the " +
                      "model's " + std::to_string(config.n_experts) + " experts");
  }
  if (o.overlap_chunks < 2) {
    throw ConfigError(
        "--ep-overlap-chunks must be >= 2 with --expert-parallel (the overlapped "
        "run beside the plain one), got " +
        std::to_string(o.overlap_chunks));
  }
  if (o.balance != "uniform") {
    throw ConfigError("--balance " + o.balance +
                      " is not supported with --expert-parallel (the PP x EP "
                      "rows cut the layers evenly)");
  }
  LinkEmulation{o.inter_node_bandwidth, 0}.validate();
}

namespace {

struct RunStats {
  double wall = 0, in_flight = 0, exposed = 0;
};

struct RankStats {
  RunStats plain, overlapped, paired, both;
};
constexpr int kRankStatsDoubles = int(sizeof(RankStats) / sizeof(double));

struct Row {
  int v = 1, m = 1;
  std::vector<RankStats> ranks;  // rank 0 only
  uint64_t wrong = 0;
  double loss = 0;
};

// One step of `stage` on `batches` (gradients zeroed first): its wall time and the EP
// communication time it added.
RunStats timed_step(PipelineStage<float>& stage, const PipelineShape& shape,
                    const std::vector<PipelineMicroBatch<float>>& batches,
                    const PipelineGroups& groups, const RoleExpertParallel& ep, double* loss,
                    bool pairing = false) {
  stage.model().zero_gradients();
  const SplitPhaseChain::Time before = ep.communication_time();
  const PipelineStepStats s =
      run_pipeline_step(stage, shape, batches, stage.model().config().aux_loss_coef,
                        groups.pipeline().comm, groups.links(), pairing);
  const SplitPhaseChain::Time after = ep.communication_time();
  if (loss) *loss = s.loss;
  return {s.wall_seconds, after.in_flight - before.in_flight, after.exposed - before.exposed};
}

// The repeat of median wall time, whole (its communication belongs to it).
RunStats median_run(std::vector<RunStats> runs) {
  std::sort(runs.begin(), runs.end(),
            [](const RunStats& a, const RunStats& b) { return a.wall < b.wall; });
  return runs[runs.size() / 2];
}

Row measure(const PipelineBenchOptions& o, const ModelConfig& config, Device& device,
            const PipelineShape& shape, Links& links, uint64_t seed) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  PipelineGroups groups(MPI_COMM_WORLD, shape, config, links, nullptr, o.expert_parallel);
  RoleExpertParallel ep(groups.data_parallel(), links, config.n_experts, o.expert_parallel,
                        DispatchMode::Flat);
  Row row;
  row.v = shape.virtual_stages;
  row.m = shape.micro_batches;
  const int m = shape.micro_batches;
  const auto all =
      random_micro_batches(m * groups.replicas(), o.sequences, o.length, config.vocab_size, seed);
  const std::vector<PipelineMicroBatch<float>> batches(all.begin() + groups.replica() * m,
                                                       all.begin() + (groups.replica() + 1) * m);
  ArenaScope scope(device.memory());
  const std::vector<LayerRange> chunks = groups.chunks(groups.stage());
  Transformer<float> model(config, device.ops(), device.memory(), /*with_gradients=*/true,
                           groups.expert_shard(), stage_layer_shard(chunks, config.n_layers));
  model.initialize(seed);
  // Every arena can hold a whole-model micro-batch: a bound for any chunk.
  const size_t activation_bytes =
      2 * training_micro_batch_peak_bytes(config, ParameterLayout(config),
                                          uniform_batch(o.sequences, o.length + 1));
  // Two stages over the one model (one weight copy), each with views of its own; both share the
  // per-slot dispatchers (their steps never interleave).
  auto dispatchers = [&](int slot) { return ep.view_dispatchers(slot, config.n_layers); };
  PipelineStage<float> plain(model, chunks, activation_bytes);
  plain.set_expert_dispatchers(dispatchers);
  PipelineStage<float> overlapped(model, chunks, activation_bytes);
  overlapped.set_expert_dispatchers(dispatchers);
  overlapped.set_expert_overlap([&](int, Arena& arena) {
    return ep.make_view_overlap(config, o.overlap_chunks, device.ops(), arena);
  });
  PipelineStage<float> paired(model, chunks, activation_bytes);
  paired.set_expert_dispatchers(dispatchers);
  PipelineStage<float> both(model, chunks, activation_bytes);
  both.set_expert_dispatchers(dispatchers);
  both.set_expert_overlap([&](int, Arena& arena) {
    return ep.make_view_overlap(config, o.overlap_chunks, device.ops(), arena);
  });

  // The checked step: the overlapped loss and gradients against the plain ones.
  double plain_loss = 0, overlapped_loss = 0;
  timed_step(plain, shape, batches, groups, ep, &plain_loss);
  const std::vector<float> want(model.gradients(), model.gradients() + model.parameter_count());
  timed_step(overlapped, shape, batches, groups, ep, &overlapped_loss);
  auto off = [](double got, double expected) {
    return !(std::fabs(got - expected) <= 1e-5 + 1e-4 * std::fabs(expected));
  };
  uint64_t wrong = off(overlapped_loss, plain_loss);
  for (int64_t i = 0; i < model.parameter_count(); ++i)
    wrong += off(model.gradients()[i], want[size_t(i)]);
  // Pairing the overlapped passes changes no arithmetic either: the overlapped step's bits.
  const std::vector<float> want_overlapped(model.gradients(),
                                           model.gradients() + model.parameter_count());
  double both_loss = 0;
  timed_step(both, shape, batches, groups, ep, &both_loss, /*pairing=*/true);
  wrong += both_loss != overlapped_loss;
  wrong += uint64_t(std::memcmp(model.gradients(), want_overlapped.data(),
                                want_overlapped.size() * sizeof(float)) != 0);
  // Pairing changes no arithmetic: the paired step's loss and gradients are the plain ones' bits.
  double paired_loss = 0;
  timed_step(paired, shape, batches, groups, ep, &paired_loss, /*pairing=*/true);
  wrong += paired_loss != plain_loss;
  wrong += uint64_t(std::memcmp(model.gradients(), want.data(), want.size() * sizeof(float)) != 0);
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  row.wrong = wrong;
  row.loss = plain_loss;

  std::vector<RunStats> plain_runs, overlapped_runs, paired_runs, both_runs;
  for (int r = 0; r < o.repeats; ++r) {
    plain_runs.push_back(timed_step(plain, shape, batches, groups, ep, nullptr));
    overlapped_runs.push_back(timed_step(overlapped, shape, batches, groups, ep, nullptr));
    paired_runs.push_back(timed_step(paired, shape, batches, groups, ep, nullptr, true));
    both_runs.push_back(timed_step(both, shape, batches, groups, ep, nullptr, true));
  }
  const RankStats mine{median_run(plain_runs), median_run(overlapped_runs), median_run(paired_runs),
                       median_run(both_runs)};
  row.ranks.resize(size_t(world));
  MPI_Gather(&mine, kRankStatsDoubles, MPI_DOUBLE, row.ranks.data(), kRankStatsDoubles, MPI_DOUBLE,
             0, MPI_COMM_WORLD);
  return row;
}

double hidden(const RunStats& r) {
  return hidden_fraction({r.in_flight, r.exposed});
}

// (plain exposed - overlapped exposed) / plain communication: `bench overlap`'s hidden fraction,
// per rank.
double taken_off(const RankStats& s) {
  return s.plain.in_flight > 0 ? (s.plain.exposed - s.overlapped.exposed) / s.plain.in_flight : 0;
}

void print_table(const PipelineBenchOptions& o, const ModelConfig& config, int p,
                 const std::vector<Row>& rows, uint64_t wrong, double load) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::printf("# rlfusion bench pipeline (PP x EP overlap): %s\n", build_info().c_str());
  std::printf(
      "# %d ranks = PP %d x DP %d, EP %d inside every stage; model %s with %d layers (d_model %d, "
      "%d experts top-%d); micro-batch = %d x %d tokens; overlapped run: %d chunks per MoE layer; "
      "emulated links: %s\n",
      world, p, world / p, o.expert_parallel, config.name.c_str(), config.n_layers, config.d_model,
      config.n_experts, config.top_k, o.sequences, o.length, o.overlap_chunks,
      o.inter_node_bandwidth > 0 ? "every rank its own node" : "none (one node)");
  std::printf(
      "# 1-minute load average at start: %.2f on %ld CPUs. Times are under that load: counted "
      "fractions, not speed claims\n",
      load, sysconf(_SC_NPROCESSORS_ONLN));
  std::printf(
      "# per run (median-wall step of %d, plain and overlapped interleaved): comm = the EP "
      "dispatches and combines from begin to completion, exposed = the rank held up by them, "
      "hidden = 1 - exposed / comm; taken off = (plain exposed - overlapped exposed) / plain comm "
      "(bench overlap's hidden fraction); ratio = plain wall / overlapped (or paired, or both) "
      "wall; paired = --pipeline-pairing; both = paired with the overlap chunks\n#\n",
      o.repeats);
  std::printf(
      "# %-16s %2s %3s %4s %9s %9s %6s %9s %9s %7s %9s %9s %7s %9s %9s %6s %9s %9s %7s %9s "
      "%6s %7s %7s\n",
      "schedule", "v", "m", "rank", "plain", "overlap", "ratio", "comm", "exposed", "hidden",
      "comm", "exposed", "hidden", "taken off", "paired", "ratio", "comm", "exposed", "hidden",
      "both", "ratio", "hidden", "#wrong");
  std::printf(
      "# %-16s %2s %3s %4s %9s %9s %6s %9s %9s %7s %9s %9s %7s %9s %9s %6s %9s %9s %7s %9s "
      "%6s %7s %7s\n",
      "", "", "", "", "wall(ms)", "wall(ms)", "(x)", "plain(ms)", "plain(ms)", "plain%", "ovl(ms)",
      "ovl(ms)", "ovl%", "(%)", "wall(ms)", "(x)", "pair(ms)", "pair(ms)", "pair%", "wall(ms)",
      "(x)", "both%", "");
  for (const Row& row : rows) {
    const std::string name = schedule_name({p, row.m, row.v});
    for (int r = 0; r < world; ++r) {
      const RankStats& s = row.ranks[size_t(r)];
      std::printf(
          "  %-16s %2d %3d %4d %9.2f %9.2f %6.2f %9.2f %9.2f %7.1f %9.2f %9.2f %7.1f %9.1f "
          "%9.2f %6.2f %9.2f %9.2f %7.1f %9.2f %6.2f %7.1f %7llu\n",
          name.c_str(), row.v, row.m, r, s.plain.wall * 1e3, s.overlapped.wall * 1e3,
          s.overlapped.wall > 0 ? s.plain.wall / s.overlapped.wall : 0, s.plain.in_flight * 1e3,
          s.plain.exposed * 1e3, 100 * hidden(s.plain), s.overlapped.in_flight * 1e3,
          s.overlapped.exposed * 1e3, 100 * hidden(s.overlapped), 100 * taken_off(s),
          s.paired.wall * 1e3, s.paired.wall > 0 ? s.plain.wall / s.paired.wall : 0,
          s.paired.in_flight * 1e3, s.paired.exposed * 1e3, 100 * hidden(s.paired),
          s.both.wall * 1e3, s.both.wall > 0 ? s.plain.wall / s.both.wall : 0, 100 * hidden(s.both),
          (unsigned long long)row.wrong);
    }
  }
  std::printf(
      "#\n# Overlapped vs plain step (loss and gradients, 1e-5 + 1e-4 |plain|; paired: loss and "
      "gradients bit for bit; both vs overlapped: bit for bit) : %llu wrong %s\n",
      (unsigned long long)wrong, wrong ? "FAIL" : "OK");
}

void print_json(const PipelineBenchOptions& o, const ModelConfig& config, int p,
                const std::vector<Row>& rows, uint64_t wrong, double load) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::printf(
      "{\"bench\":\"pipeline_ep_overlap\",\"ranks\":%d,\"pipeline_parallel\":%d,"
      "\"expert_parallel\":%d,\"ep_overlap_chunks\":%d,\"model\":\"%s\",\"layers\":%d,"
      "\"sequences\":%d,\"length\":%d,\"inter_node_bandwidth\":%g,\"load_average\":%.2f,"
      "\"rows\":[",
      world, p, o.expert_parallel, o.overlap_chunks, config.name.c_str(), config.n_layers,
      o.sequences, o.length, o.inter_node_bandwidth, load);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    std::printf(
        "%s{\"virtual_stages\":%d,\"micro_batches\":%d,\"loss\":%.8g,\"wrong\":%llu,"
        "\"ranks\":[",
        i ? "," : "", row.v, row.m, row.loss, (unsigned long long)row.wrong);
    for (int r = 0; r < world; ++r) {
      const RankStats& s = row.ranks[size_t(r)];
      std::printf(
          "%s{\"rank\":%d,\"plain\":{\"wall_seconds\":%.6e,\"communication_seconds\":%.6e,"
          "\"exposed_seconds\":%.6e,\"hidden_fraction\":%.4f},\"overlapped\":{\"wall_seconds\":"
          "%.6e,\"communication_seconds\":%.6e,\"exposed_seconds\":%.6e,\"hidden_fraction\":%.4f},"
          "\"paired\":{\"wall_seconds\":%.6e,\"communication_seconds\":%.6e,\"exposed_seconds\":"
          "%.6e,\"hidden_fraction\":%.4f},\"both\":{\"wall_seconds\":%.6e,"
          "\"communication_seconds\":%.6e,\"exposed_seconds\":%.6e,\"hidden_fraction\":%.4f},"
          "\"taken_off\":%.4f}",
          r ? "," : "", r, s.plain.wall, s.plain.in_flight, s.plain.exposed, hidden(s.plain),
          s.overlapped.wall, s.overlapped.in_flight, s.overlapped.exposed, hidden(s.overlapped),
          s.paired.wall, s.paired.in_flight, s.paired.exposed, hidden(s.paired), s.both.wall,
          s.both.in_flight, s.both.exposed, hidden(s.both), taken_off(s));
    }
    std::printf("]}");
  }
  std::printf("],\"wrong\":%llu}\n", (unsigned long long)wrong);
}

}  // namespace

uint64_t run_pipeline_overlap_rows(const PipelineBenchOptions& o, const ModelConfig& config,
                                   Device& device, const std::vector<int>& virtual_stages,
                                   const std::vector<int>& micro_batches, uint64_t seed,
                                   bool json) {
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int p = o.pipeline_parallel > 0 ? o.pipeline_parallel : world;
  std::vector<int> node_of(size_t(world), 0);
  if (o.inter_node_bandwidth > 0)
    for (int r = 0; r < world; ++r) node_of[size_t(r)] = r;
  Links links(node_of, LinkEmulation{o.inter_node_bandwidth, 0});
  double load[1] = {-1};
  if (getloadavg(load, 1) != 1) load[0] = -1;
  std::vector<Row> rows;
  for (int v : virtual_stages)
    for (int m : micro_batches) rows.push_back(measure(o, config, device, {p, m, v}, links, seed));
  uint64_t wrong = 0;
  for (const Row& r : rows) wrong += r.wrong;
  if (rank == 0) {
    print_table(o, config, p, rows, wrong, load[0]);
    if (json) print_json(o, config, p, rows, wrong, load[0]);
  }
  return wrong;
}

}  // namespace rlf
