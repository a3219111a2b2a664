// `rlfusion bench migration`: expert migration live, on EP = the world. One MoE layer's routed
// experts (dispatch, grouped SwiGLU forward, combine) run on Zipf-skewed routing whose hot experts
// all start on EP rank 0; the step is timed, the experts are re-placed from the measured token
// counts (src/balance/ two-level placement, no replicas) and moved rank to rank
// (src/runtime/expert_migration.h; weights only here, tests/mpi/test_expert_migration.cpp moves
// AdamW's moments too), and the step is timed again on the same tokens, the two placements
// interleaved. The combined output must be bit-identical. A third phase gives every rank
// --redundant-slots spare slots: the same counts placed with replicas of the hot experts, the
// replicas copied in rank to rank (copy_experts_into_slots), the dispatcher splitting a replicated
// expert's tokens over its replicas; its output must match within float tolerance. Times: wall
// clock of the slowest rank.
#include <mpi.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "kernels/device.h"
#include "kernels/error.h"
#include "kernels/rng.h"
#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/topology.h"
#include "src/app/bench_timing.h"
#include "src/app/build_info.h"
#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/balance/expert_placement.h"
#include "src/balance/routing_trace.h"
#include "src/model/expert_table.h"
#include "src/model/parameter_layout.h"
#include "src/runtime/expert_migration.h"

namespace rlf {

namespace {

// The machine's 1-minute load average (-1 when unknown): wall times mean little above the core
// count.
double load_average() {
  double load[1] = {-1};
  return getloadavg(load, 1) == 1 ? load[0] : -1;
}

struct MigrationBenchOptions {
  int tokens = 4096, experts_per_rank = 4, top_k = 2, hidden = 128, ffn = 512, repeats = 7;
  int redundant_slots = 1;
  double zipf = 1.2;
};

// CPU seconds of this process (all its threads): the expert FFN's work, which a loaded machine
// stretches far less than the wall clock (the FFN calls no MPI, so no polling is counted).
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

}  // namespace

int run_bench_migration_command(const std::vector<std::string>& args) {
  RunOptions run;
  MigrationBenchOptions o;
  po::options_description description = run_options_description(run);
  po::options_description bench("bench migration options");
  auto add = bench.add_options();
  add("tokens", po::value(&o.tokens)->default_value(o.tokens), "tokens per rank");
  add("experts-per-rank", po::value(&o.experts_per_rank)->default_value(o.experts_per_rank),
      "routed experts per rank");
  add("top-k", po::value(&o.top_k)->default_value(o.top_k), "experts per token");
  add("hidden", po::value(&o.hidden)->default_value(o.hidden), "model width C");
  add("ffn", po::value(&o.ffn)->default_value(o.ffn), "expert hidden width F");
  add("zipf", po::value(&o.zipf)->default_value(o.zipf),
      "routing skew: expert e gets weight (e + 1)^-zipf, so the hot experts start on rank 0");
  add("repeats", po::value(&o.repeats)->default_value(o.repeats),
      "timed steps per phase (median, >= 3)");
  add("redundant-slots", po::value(&o.redundant_slots)->default_value(o.redundant_slots),
      "spare expert slots per rank for the replica phase (0: no replica phase)");
  description.add(bench);
  if (!parse_options("bench migration", args, description, run)) return 0;
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (o.repeats < 3) throw ConfigError("--repeats must be >= 3, got " + std::to_string(o.repeats));
  if (o.tokens < 1 || o.experts_per_rank < 1 || o.hidden < 1 || o.ffn < 1) {
    throw ConfigError("--tokens, --experts-per-rank, --hidden and --ffn must be >= 1");
  }
  const int E = o.experts_per_rank * size, E_local = o.experts_per_rank, N = o.tokens, K = o.top_k,
            C = o.hidden, F = o.ffn;
  DriftingZipfOptions routing{E, N, K, o.zipf, 0, run.seed};
  routing.validate();
  if (size < 2) throw ConfigError("bench migration needs >= 2 ranks (EP = the world)");
  validate_redundant_slots(o.redundant_slots, E, size, "--redundant-slots");

  Links links(std::vector<int>(size_t(size), 0), LinkEmulation{});
  HierarchicalComm ep = make_hierarchical(MPI_COMM_WORLD, links);
  ModelConfig config = load_model_config("tiny");
  config.n_layers = 1;
  config.d_model = C;
  config.n_heads = 1;
  config.d_ff = F;
  config.n_experts = E;
  config.top_k = K;
  const ParameterLayout layout(config, ExpertShard{rank * E_local, E_local});
  std::vector<float> params(size_t(layout.total()));
  initialize_parameters(params.data(), layout, config, run.seed);
  const ExpertTable<float> experts(layout, params.data());
  Device device(Backend::Cpu, run.device_memory_bytes(), resolve_threads(run.threads));
  const Ops<float>& ops = cpu_ops();

  // This rank's tokens, routing and combine weights.
  std::vector<float> x(size_t(N) * C), gate(size_t(N) * K);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = philox_uniform(run.seed, 10 + uint64_t(rank), i) - 0.5f;
  for (size_t i = 0; i < gate.size(); ++i)
    gate[i] = philox_uniform(run.seed, 50 + uint64_t(rank), i);
  const std::vector<int> idx =
      DriftingZipfRouter(routing).route(N, (uint64_t(1) << 32) + uint64_t(rank));

  ExpertDispatcher dispatcher(ep, links, E, DispatchMode::Flat);
  std::vector<float> out;
  double ffn_cpu_seconds = 0;  // of the last step
  // One forward of the layer through `d` with the experts of its local slots at `table`.
  auto step_with = [&](ExpertDispatcher& d, const ExpertTable<float>& table) {
    ArenaScope scope(device.memory());
    const std::vector<float> rows = d.dispatch(x.data(), idx.data(), N, K, C);
    const int R = d.local_rows();
    std::vector<float> y(size_t(R) * C), a(size_t(R) * F), b(size_t(R) * F);
    const double cpu0 = process_cpu_seconds();
    ops.expert_ffn_forward(y.data(), a.data(), b.data(), rows.data(), table.w1(0), table.w3(0),
                           table.w2(0), d.local_expert_offsets().data(), d.local_experts(), C, F,
                           device.memory());
    ffn_cpu_seconds = process_cpu_seconds() - cpu0;
    out = d.combine(y.data(), gate.data());
    return R;
  };
  auto step = [&] { return step_with(dispatcher, experts); };
  // Re-place from the measured counts (the router statistics of the step) and build the table.
  std::vector<double> counts(size_t(E), 0.0);
  for (int e : idx) counts[size_t(e)] += 1;
  MPI_Allreduce(MPI_IN_PLACE, counts.data(), E, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  const ExpertCluster cluster{1, size, E_local};
  const Placement current = round_robin_placement(cluster, E);
  const Placement target = align_to(place_two_level(counts, cluster), current);
  std::vector<int> identity(static_cast<size_t>(E)), slot_of(static_cast<size_t>(E));
  std::iota(identity.begin(), identity.end(), 0);
  for (size_t s = 0; s < target.slot_expert.size(); ++s) {
    slot_of[size_t(target.slot_expert[s])] = int(s);
  }
  int moved = 0;
  for (int e = 0; e < E; ++e) moved += slot_of[size_t(e)] / E_local != e / E_local;

  // Replica phase: E_local + R slots per rank, each a bucket w1 | w3 | w2. They start in the
  // default slot table (the spare slots holding the next rank's first experts, filled from the
  // full model every rank initializes alike), then take the two-level placement of the same
  // counts on the larger cluster, the changed slots copied in rank to rank.
  const int R_spare = o.redundant_slots, L = E_local + R_spare;
  const int64_t bucket = expert_bucket_elements(config);
  std::vector<float> slot_weights(size_t(L) * size_t(bucket));
  ExpertTable<float> slot_table(1, ExpertShard{rank * L, L});
  std::unique_ptr<ExpertDispatcher> replica_dispatcher;
  double replica_sent = 0, replica_seconds = 0;
  int replica_copies = 0;  // slots holding a second or later copy of an expert
  if (R_spare > 0) {
    const ParameterLayout full_layout(config);
    std::vector<float> full(size_t(full_layout.total()));
    initialize_parameters(full.data(), full_layout, config, run.seed);
    const ExpertTable<float> full_experts(full_layout, full.data());
    const std::vector<int> start = default_slot_experts(E, size, R_spare);
    std::vector<std::vector<ParameterRange>> slot_ranges;
    for (int i = 0; i < L; ++i) {
      const int e = start[size_t(rank * L + i)];
      float* b = slot_weights.data() + i * bucket;
      std::copy_n(full_experts.w1(0)[e], F * C, b);
      std::copy_n(full_experts.w3(0)[e], F * C, b + F * C);
      std::copy_n(full_experts.w2(0)[e], C * F, b + 2 * F * C);
      slot_table.set_bucket(0, rank * L + i, b, F, C);
      slot_ranges.push_back({{i * bucket, bucket}});
    }
    const ExpertCluster spare_cluster{1, size, L};
    const Placement start_placement{spare_cluster, E, start};
    const Placement replicated = align_to(place_two_level(counts, spare_cluster), start_placement);
    for (int e = 0; e < E; ++e) replica_copies += std::max(0, replicated.replicas()[size_t(e)] - 1);
    replica_dispatcher =
        std::make_unique<ExpertDispatcher>(ep, links, E, DispatchMode::Flat, 0, R_spare);
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    replica_sent = double(copy_experts_into_slots({start}, {replicated.slot_expert}, E, L,
                                                  slot_ranges, {slot_weights.data()}, ep.comm));
    replica_dispatcher->set_slot_experts(replicated.slot_expert);
    replica_seconds = max_over_world(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    MPI_Allreduce(MPI_IN_PLACE, &replica_sent, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  }
  // Moves the experts from table `from` to table `to`; returns (slowest seconds, bytes sent).
  auto migrate = [&](const std::vector<int>& from, const std::vector<int>& to) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    double sent = double(move_expert_slots(from, to, layout, E_local, {params.data()}, ep.comm));
    dispatcher.set_expert_slots(to);
    const double seconds = max_over_world(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    MPI_Allreduce(MPI_IN_PLACE, &sent, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return std::pair<double, double>{seconds, sent};
  };
  // Wall seconds and expert-FFN CPU seconds of one step, each of the slowest rank.
  auto timed_step = [&] {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    step();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return std::pair<double, double>{max_over_world(wall), max_over_world(ffn_cpu_seconds)};
  };
  auto rows_of = [&](double rows, double& max, double& mean) {
    max = max_over_world(rows);
    MPI_Allreduce(MPI_IN_PLACE, &rows, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    mean = rows / size;
  };
  struct Phase {
    std::vector<double> seconds, ffn_cpu;
    double rows_max = 0, rows_mean = 0;
    std::vector<float> out;
  } before, after, replicas;
  // Warm-ups (untimed) give the rows and outputs; then the phases interleave (replicas, before,
  // migrate, after, migrate back) so a machine whose load drifts hits all alike.
  rows_of(step(), before.rows_max, before.rows_mean);
  before.out = out;
  const auto [migration_seconds, sent] = migrate(identity, slot_of);
  rows_of(step(), after.rows_max, after.rows_mean);
  after.out = out;
  migrate(slot_of, identity);
  if (replica_dispatcher) {
    rows_of(step_with(*replica_dispatcher, slot_table), replicas.rows_max, replicas.rows_mean);
    replicas.out = out;
  }
  for (int r = 0; r < o.repeats; ++r) {
    if (replica_dispatcher) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      step_with(*replica_dispatcher, slot_table);
      replicas.seconds.push_back(max_over_world(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
      replicas.ffn_cpu.push_back(max_over_world(ffn_cpu_seconds));
    }
    for (Phase* p : {&before, &after}) {
      const auto [wall, cpu] = timed_step();
      p->seconds.push_back(wall);
      p->ffn_cpu.push_back(cpu);
      if (p == &before) {
        migrate(identity, slot_of);
      } else {
        migrate(slot_of, identity);
      }
    }
  }
  int same = before.out == after.out ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  // Replicas change which rows an expert's GEMM sees together, so a blocked kernel may round a
  // row differently: the largest difference relative to the output's largest magnitude.
  double replica_error = 0, largest = 0;
  for (size_t i = 0; i < replicas.out.size(); ++i) {
    replica_error = std::max(replica_error, double(std::fabs(replicas.out[i] - before.out[i])));
    largest = std::max(largest, double(std::fabs(before.out[i])));
  }
  MPI_Allreduce(MPI_IN_PLACE, &largest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  replica_error = max_over_world(replica_error) / std::max(largest, 1e-30);
  const bool replicas_match = replica_error <= 1e-5;
  free_hierarchical(ep);

  const double before_s = median(before.seconds), after_s = median(after.seconds);
  const double speedup = before_s / after_s;
  const double cpu_speedup = median(before.ffn_cpu) / median(after.ffn_cpu);
  if (rank == 0) {
    std::printf("# rlfusion bench migration: %s\n", build_info().c_str());
    std::printf(
        "# EP %d (the world), %d experts (%d per rank), %d tokens/rank, top-%d, Zipf(%g) routing "
        "with the hot experts on rank 0; C %d, F %d; one MoE layer's routed experts forward "
        "(dispatch, SwiGLU, combine); median of %d, slowest rank; load average %.2f at the end "
        "(wall times need one idle core per rank)\n#\n",
        size, E, E_local, N, K, o.zipf, C, F, o.repeats, load_average());
    std::printf("# %-8s %10s %12s %12s %12s %9s\n", "phase", "step wall", "expert FFN", "rows max",
                "rows mean", "max/mean");
    std::printf("# %-8s %10s %12s %12s %12s %9s\n", "", "(ms)", "(CPU ms)", "(rows)", "(rows)", "");
    std::vector<std::pair<const char*, const Phase*>> phases{{"before", &before},
                                                             {"after", &after}};
    if (replica_dispatcher) phases.emplace_back("replicas", &replicas);
    for (const auto& [name, phase] : phases) {
      const Phase& p = *phase;
      std::printf("  %-8s %10.2f %12.2f %12.0f %12.1f %9.3f\n", name, median(p.seconds) * 1e3,
                  median(p.ffn_cpu) * 1e3, p.rows_max, p.rows_mean, p.rows_max / p.rows_mean);
    }
    std::printf("#\n# Migration: %d experts changed rank, %.0f B sent, %.2f ms (slowest rank)\n",
                moved, sent, migration_seconds * 1e3);
    std::printf("# Output after migration bit-identical  : %s\n", same ? "OK" : "FAIL");
    std::printf(
        "# Expert FFN CPU time before/after      : %.2fx %s (rows max before/after %.2fx)\n",
        cpu_speedup, cpu_speedup > 1 ? "faster" : "NOT FASTER", before.rows_max / after.rows_max);
    std::printf("# Step wall time before/after           : %.2fx %s\n", speedup,
                speedup > 1 ? "faster" : "NOT FASTER");
    if (replica_dispatcher) {
      std::printf(
          "# Replicas (%d spare slot(s)/rank)       : %d extra copies, %.0f B sent, %.2f ms; rows "
          "max after/replicas %.2fx; output within 1e-5 of before: %s (%.2e)\n",
          R_spare, replica_copies, replica_sent, replica_seconds * 1e3,
          after.rows_max / replicas.rows_max, replicas_match ? "OK" : "FAIL", replica_error);
    }
    if (run.json) {
      std::printf(
          "{\"bench\":\"migration\",\"ranks\":%d,\"experts\":%d,\"tokens\":%d,\"top_k\":%d,"
          "\"zipf\":%g,\"before_seconds\":%.6e,\"after_seconds\":%.6e,\"before_rows_max\":%.0f,"
          "\"after_rows_max\":%.0f,\"rows_mean\":%.1f,\"moved_experts\":%d,\"sent_bytes\":%.0f,"
          "\"migration_seconds\":%.6e,\"bit_identical\":%d,\"speedup\":%.4f,"
          "\"ffn_cpu_speedup\":%.4f,\"redundant_slots\":%d,\"replica_copies\":%d,"
          "\"replica_rows_max\":%.0f,\"replica_seconds\":%.6e,\"replica_sent_bytes\":%.0f,"
          "\"replica_error\":%.3e,\"replica_match\":%d}\n",
          size, E, N, K, o.zipf, before_s, after_s, before.rows_max, after.rows_max,
          before.rows_mean, moved, sent, migration_seconds, same, speedup, cpu_speedup, R_spare,
          replica_copies, replicas.rows_max,
          replicas.seconds.empty() ? 0 : median(replicas.seconds), replica_sent, replica_error,
          replicas_match ? 1 : 0);
    }
  }
  return same && replicas_match ? 0 : 1;
}

}  // namespace rlf
