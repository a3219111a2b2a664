// `rlfusion bench overlap`: expert-parallel communication overlap (OverlappedExperts). In one run
// and on the same data it times, interleaved: the plain step (blocking dispatch, expert FFN,
// blocking combine, then combine_backward, FFN backward, dispatch_backward), its compute alone,
// its communication alone, and the chunked overlapped step; with link emulation on (the options)
// and off. hidden fraction = (T_compute + T_comm - T_overlapped) / T_comm. The overlapped
// results are checked against the plain ones (#wrong). nccl-tests style: '#' header with units,
// fixed columns, verdict lines and a --json twin.
#include <mpi.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/error.h"
#include "kernels/moe.h"
#include "kernels/rng.h"
#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/links.h"
#include "mpi_comm/topology.h"
#include "src/app/bench_timing.h"
#include "src/app/build_info.h"
#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/model/overlapped_experts.h"

namespace rlf {

namespace {

struct OverlapOptions {
  // Defaults: on 2 ranks with one core each, a step's expert FFN takes ~200 ms and its emulated
  // link time ~100 ms (~80% of its communication): communication worth hiding, less than the
  // compute in forward (FFN forward ~1/3 of the FFN) as well as in backward, so the step is not
  // bound by the link. Slower links (--inter-node-bandwidth 40e6) make forward link-bound.
  int tokens = 1024, hidden = 256, ffn = 512, top_k = 4, experts = 16, ranks_per_node = 1;
  int chunks = 4, repeats = 5;
  std::string mode = "flat";
  double inter_bandwidth = 80e6, inter_latency = 0, intra_bandwidth = 0;
};

DispatchMode parse_mode(const std::string& name) {
  for (DispatchMode mode :
       {DispatchMode::Flat, DispatchMode::FlatDedup, DispatchMode::Hierarchical}) {
    if (name == dispatch_mode_name(mode)) return mode;
  }
  throw ConfigError("--mode must be flat, flat-dedup or hierarchical, got '" + name + "'");
}

void validate(const OverlapOptions& o, int world_size) {
  // Arithmetic on the options and the world size only: the same error on every rank.
  if (o.chunks < 1) {
    throw ConfigError("--chunks must be >= 1 (1: no overlap), got " + std::to_string(o.chunks));
  }
  if (o.repeats < 3) throw ConfigError("--repeats must be >= 3, got " + std::to_string(o.repeats));
  if (o.tokens < 0 || o.hidden < 1 || o.ffn < 1 || o.top_k < 1 || o.top_k > o.experts) {
    throw ConfigError(
        "--tokens must be >= 0, --hidden and --ffn >= 1 and --top-k in [1, --experts]");
  }
  if (o.ranks_per_node < 1 || world_size % o.ranks_per_node != 0) {
    throw ConfigError("--ranks-per-node " + std::to_string(o.ranks_per_node) +
                      " must be >= 1 and divide the " + std::to_string(world_size) + " ranks");
  }
  validate_expert_parallel(o.experts, world_size, world_size);
  parse_mode(o.mode);
  LinkEmulation{o.inter_bandwidth, o.inter_latency}.validate();
  if (!(o.intra_bandwidth >= 0) || !std::isfinite(o.intra_bandwidth)) {
    throw ConfigError("--intra-node-bandwidth must be a finite number of bytes per second >= 0");
  }
}

// A barrier that sleeps instead of busy-polling: a rank that finished first must not take the
// core of one still computing.
void quiet_barrier() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  wait_with_backoff(&request, MPI_STATUS_IGNORE);
}

// This rank's inputs: tokens with distinct top-k experts (uniform), positive combine weights,
// an upstream gradient, and its local experts' weights.
struct Inputs {
  std::vector<float> x, weight, dout, w1, w3, w2;
  std::vector<int> idx;
};

Inputs make_inputs(const OverlapOptions& o, uint64_t seed, int rank, int local_experts) {
  const int N = o.tokens, C = o.hidden, K = o.top_k, F = o.ffn;
  auto uniform = [&](uint64_t stream, uint64_t i) { return philox_uniform(seed, stream, i); };
  Inputs in;
  in.x.resize(size_t(N) * C);
  in.dout.resize(size_t(N) * C);
  for (size_t i = 0; i < in.x.size(); ++i) {
    in.x[i] = uniform(1000 + uint64_t(rank), i) - 0.5f;
    in.dout[i] = uniform(2000 + uint64_t(rank), i) - 0.5f;
  }
  for (int n = 0; n < N; ++n) {
    std::set<int> used;
    for (uint64_t draw = 0; int(used.size()) < K; ++draw) {
      const int e = std::min(
          o.experts - 1,
          int(uniform(3000 + uint64_t(rank), uint64_t(n) * 4096 + draw) * float(o.experts)));
      if (!used.insert(e).second) continue;
      in.idx.push_back(e);
      in.weight.push_back(0.1f + uniform(4000 + uint64_t(rank), uint64_t(n) * 64 + used.size()));
    }
  }
  const float scale = 1.0f / std::sqrt(float(C));
  for (auto* w : {&in.w1, &in.w3, &in.w2}) w->resize(size_t(local_experts) * F * C);
  for (size_t i = 0; i < in.w1.size(); ++i) {
    in.w1[i] = (uniform(5000 + uint64_t(rank), i) - 0.5f) * scale;
    in.w3[i] = (uniform(6000 + uint64_t(rank), i) - 0.5f) * scale;
    in.w2[i] = (uniform(7000 + uint64_t(rank), i) - 0.5f) * scale;
  }
  return in;
}

struct StepResult {
  std::vector<float> out, dx, dweight, dw1, dw3, dw2;
};

struct Row {
  std::string emulation;
  double plain = 0, compute = 0, comm = 0, overlapped = 0, emulated = 0;
  double waiting = 0, progressing = 0;  // inside the overlapped step, slowest rank's median
  uint64_t wrong = 0;
  double speedup() const { return plain / overlapped; }
  double hidden() const { return comm > 0 ? (compute + comm - overlapped) / comm : 0; }
  double emulated_share() const { return comm > 0 ? emulated / comm : 0; }
};

// Elements of `got` outside |got - want| <= 1e-5 + 1e-4 |want| (the tests' tolerance: the FFN
// kernel's blocking depends on the chunk's row count).
uint64_t count_wrong(const std::vector<float>& got, const std::vector<float>& want) {
  uint64_t wrong = got.size() != want.size();
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    wrong += !(std::fabs(got[i] - want[i]) <= 1e-5f + 1e-4f * std::fabs(want[i]));
  }
  return wrong;
}

// One emulation setting: the plain and the overlapped layer on the same inputs, checked, then
// the four bodies timed interleaved.
Row measure(const std::string& name, const LinkEmulation& emulation, double intra_bandwidth,
            const OverlapOptions& o, const Inputs& in, Device& device, int size) {
  std::vector<int> node_of(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) node_of[size_t(r)] = r / o.ranks_per_node;
  Links links(node_of, emulation);
  HierarchicalComm ep = make_hierarchical(MPI_COMM_WORLD, links);
  const DispatchMode mode = parse_mode(o.mode);
  const int N = o.tokens, K = o.top_k, C = o.hidden, F = o.ffn;
  Row row;
  row.emulation = name;
  {
    OverlappedExperts plain(ep, links, o.experts, mode, 1, C, F, device.ops(), device.memory(),
                            intra_bandwidth);
    OverlappedExperts overlapped(ep, links, o.experts, mode, o.chunks, C, F, device.ops(),
                                 device.memory(), intra_bandwidth);
    const int64_t FC = int64_t(F) * C;
    const int local = int(int64_t(in.w1.size()) / FC);
    const auto w1 = consecutive_experts(in.w1.data(), local, FC);
    const auto w3 = consecutive_experts(in.w3.data(), local, FC);
    const auto w2 = consecutive_experts(in.w2.data(), local, FC);
    const LocalExperts w{w1.data(), w3.data(), w2.data()};
    // The local experts' gradients in three [local, F, C] buffers.
    auto gradients = [&](std::vector<float>& dw1, std::vector<float>& dw3,
                         std::vector<float>& dw2) {
      return std::vector<std::vector<float*>>{consecutive_experts(dw1.data(), local, FC),
                                              consecutive_experts(dw3.data(), local, FC),
                                              consecutive_experts(dw2.data(), local, FC)};
    };
    // Results are zeroed once: gradients accumulating over timed repeats cost nothing extra.
    auto zeroed = [&] {
      StepResult r;
      r.out.assign(size_t(N) * C, 0.0f);
      r.dx.assign(size_t(N) * C, 0.0f);
      r.dweight.assign(size_t(N) * K, 0.0f);
      for (auto* g : {&r.dw1, &r.dw3, &r.dw2}) g->assign(in.w1.size(), 0.0f);
      return r;
    };
    auto step = [&](OverlappedExperts& layer, StepResult& r) {
      const auto g = gradients(r.dw1, r.dw3, r.dw2);
      layer.forward(w, in.x.data(), in.idx.data(), in.weight.data(), N, K, r.out.data());
      layer.backward(w, {g[0].data(), g[1].data(), g[2].data()}, in.dout.data(), r.dx.data(),
                     r.dweight.data());
      quiet_barrier();
    };
    StepResult want = zeroed(), got = zeroed();
    step(plain, want);
    step(overlapped, got);
    uint64_t wrong = count_wrong(got.out, want.out) + count_wrong(got.dx, want.dx) +
                     count_wrong(got.dweight, want.dweight) + count_wrong(got.dw1, want.dw1) +
                     count_wrong(got.dw3, want.dw3) + count_wrong(got.dw2, want.dw2);
    row.wrong = sum_over_world(wrong);

    // The emulated link time of one step's exchanges on this rank (all four, un-chunked).
    plain.communicate_only(in.x.data(), in.idx.data(), in.weight.data(), N, K, in.dout.data());
    const double before = plain.dispatcher(0).traffic().emulated_seconds;
    plain.communicate_only(in.x.data(), in.idx.data(), in.weight.data(), N, K, in.dout.data());
    row.emulated = max_over_world(plain.dispatcher(0).traffic().emulated_seconds - before);

    StepResult scratch = zeroed();
    std::vector<double> waiting, progressing;
    std::vector<float> dw1(in.w1.size()), dw3(in.w1.size()), dw2(in.w1.size());
    const auto alone = gradients(dw1, dw3, dw2);
    auto plain_step = [&] { step(plain, scratch); };
    auto compute_alone = [&] {
      // The plain step's rows and upstream gradients (its last step) through the FFN alone.
      plain.compute_only(w, {alone[0].data(), alone[1].data(), alone[2].data()});
      quiet_barrier();
    };
    auto comm_alone = [&] {
      plain.communicate_only(in.x.data(), in.idx.data(), in.weight.data(), N, K, in.dout.data());
      quiet_barrier();
    };
    auto overlapped_step = [&] {
      step(overlapped, scratch);
      waiting.push_back(overlapped.overhead().waiting);
      progressing.push_back(overlapped.overhead().progressing);
    };
    const std::vector<double> medians =
        time_interleaved({plain_step, compute_alone, comm_alone, overlapped_step}, o.repeats);
    row.waiting = max_over_world(median(waiting));
    row.progressing = max_over_world(median(progressing));
    row.plain = max_over_world(medians[0]);
    row.compute = max_over_world(medians[1]);
    row.comm = max_over_world(medians[2]);
    row.overlapped = max_over_world(medians[3]);
  }
  free_hierarchical(ep);
  return row;
}

}  // namespace

int run_bench_overlap_command(const std::vector<std::string>& args) {
  RunOptions run;
  OverlapOptions o;
  po::options_description description = run_options_description(run);
  po::options_description bench("bench overlap options");
  auto add = bench.add_options();
  add("tokens", po::value(&o.tokens)->default_value(o.tokens), "tokens per rank (N)");
  add("hidden", po::value(&o.hidden)->default_value(o.hidden), "model width (C)");
  add("ffn", po::value(&o.ffn)->default_value(o.ffn), "expert FFN width (F)");
  add("top-k", po::value(&o.top_k)->default_value(o.top_k), "experts per token (K)");
  add("experts", po::value(&o.experts)->default_value(o.experts),
      "experts (E), sharded over the world (EP = world size)");
  add("chunks", po::value(&o.chunks)->default_value(o.chunks),
      "overlap chunks per rank's tokens (>= 1; 1 = the plain step)");
  add("mode", po::value(&o.mode)->default_value(o.mode), "dispatch: flat|flat-dedup|hierarchical");
  add("ranks-per-node", po::value(&o.ranks_per_node)->default_value(o.ranks_per_node),
      "virtual nodes of this many consecutive ranks");
  add("inter-node-bandwidth", po::value(&o.inter_bandwidth)->default_value(o.inter_bandwidth),
      "emulated inter-node bandwidth in bytes/s of the 'on' row (0: not slowed)");
  add("inter-node-latency", po::value(&o.inter_latency)->default_value(o.inter_latency),
      "emulated inter-node latency per message in seconds of the 'on' row");
  add("intra-node-bandwidth", po::value(&o.intra_bandwidth)->default_value(o.intra_bandwidth),
      "emulated intra-node bandwidth in bytes/s of the 'on' row (0: not slowed)");
  add("repeats", po::value(&o.repeats)->default_value(o.repeats),
      "timed repeats of each body, interleaved (median reported, >= 3)");
  description.add(bench);
  if (!parse_options("bench overlap", args, description, run)) return 0;

  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  validate(o, size);
  Device device(run.backend_kind(), run.device_memory_bytes(), resolve_threads(run.threads));
  const Inputs in = make_inputs(o, run.seed, rank, o.experts / size);

  std::vector<Row> rows;
  rows.push_back(
      measure("on", {o.inter_bandwidth, o.inter_latency}, o.intra_bandwidth, o, in, device, size));
  rows.push_back(measure("off", {}, 0, o, in, device, size));

  // Where every rank ran: its CPUs, gathered to rank 0.
  const std::string cpus = cpu_lists_of_ranks();
  uint64_t wrong = 0;
  for (const Row& r : rows) wrong += r.wrong;
  if (rank == 0) {
    std::printf("# rlfusion bench overlap: %s\n", build_info().c_str());
    std::printf(
        "# %d ranks = EP %d on %d virtual nodes, %s dispatch, tokens/rank %d, hidden %d, ffn %d, "
        "top-k %d, experts %d, chunks %d\n",
        size, size, size / o.ranks_per_node, o.mode.c_str(), o.tokens, o.hidden, o.ffn, o.top_k,
        o.experts, o.chunks);
    std::printf("# each rank: %s; CPUs of rank r:", device.describe().c_str());
    std::printf("%s", cpus.c_str());
    std::printf(
        "\n# emulation 'on': inter-node %.3g B/s + %.3g s/message, intra-node %.3g B/s; 'off': "
        "none. Median of %d interleaved repeats, time = slowest rank\n",
        o.inter_bandwidth, o.inter_latency, o.intra_bandwidth, o.repeats);
    std::printf(
        "# step = routed experts of one MoE layer, forward + backward; plain = blocking; "
        "compute / comm = its FFN / its four exchanges alone; hidden = (compute + comm - "
        "overlapped) / comm;\n# waiting / progress = inside the overlapped step, time waiting "
        "for transfers / inside the progress calls between FFN pieces\n#\n");
    std::printf("# %-9s %9s %9s %9s %10s %8s %7s %9s %9s %9s %9s %7s\n", "emulation", "plain",
                "compute", "comm", "overlapped", "speed-up", "hidden", "waiting", "progress",
                "emulated", "emul/comm", "#wrong");
    std::printf("# %-9s %9s %9s %9s %10s %8s %7s %9s %9s %9s %9s %7s\n", "", "(ms)", "(ms)", "(ms)",
                "(ms)", "(x)", "(%)", "(ms)", "(ms)", "(ms)", "(%)", "");
    for (const Row& r : rows) {
      std::printf("  %-9s %9.2f %9.2f %9.2f %10.2f %8.2f %7.1f %9.2f %9.2f %9.2f %9.1f %7llu\n",
                  r.emulation.c_str(), r.plain * 1e3, r.compute * 1e3, r.comm * 1e3,
                  r.overlapped * 1e3, r.speedup(), 100 * r.hidden(), r.waiting * 1e3,
                  r.progressing * 1e3, r.emulated * 1e3, 100 * r.emulated_share(),
                  (unsigned long long)r.wrong);
    }
    std::printf("#\n# Overlapped vs plain results        : %llu wrong %s\n",
                (unsigned long long)wrong, wrong ? "FAIL" : "OK");
    for (const Row& r : rows) {
      std::printf(
          "# Emulation %-3s: overlapped %s plain (%.2fx); hidden fraction %.0f%% of the "
          "communication (goal >= 90%% with communication engines)\n",
          r.emulation.c_str(), r.overlapped < r.plain ? "faster than" : "NOT faster than",
          r.speedup(), 100 * r.hidden());
    }
    std::printf(
        "# On a CPU-only machine MPI's shared-memory copies and the progress calls run on the "
        "compute cores: only the emulated link time (sleeps) can hide behind the FFN; see "
        "docs/METRICS.md\n");
  }
  if (run.json && rank == 0) {
    std::printf(
        "{\"bench\":\"overlap\",\"ranks\":%d,\"ep\":%d,\"nodes\":%d,\"mode\":\"%s\",\"tokens\":%d,"
        "\"hidden\":%d,\"ffn\":%d,\"top_k\":%d,\"experts\":%d,\"chunks\":%d,"
        "\"inter_node_bandwidth\":%g,\"inter_node_latency\":%g,\"intra_node_bandwidth\":%g,"
        "\"rows\":[",
        size, size, size / o.ranks_per_node, o.mode.c_str(), o.tokens, o.hidden, o.ffn, o.top_k,
        o.experts, o.chunks, o.inter_bandwidth, o.inter_latency, o.intra_bandwidth);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf(
          "%s{\"emulation\":\"%s\",\"plain_seconds\":%.6e,\"compute_seconds\":%.6e,"
          "\"comm_seconds\":%.6e,\"overlapped_seconds\":%.6e,\"speedup\":%.4f,"
          "\"hidden_fraction\":%.4f,\"waiting_seconds\":%.6e,\"progress_seconds\":%.6e,"
          "\"emulated_seconds\":%.6e,\"emulated_share\":%.4f,\"wrong\":%llu}",
          i ? "," : "", r.emulation.c_str(), r.plain, r.compute, r.comm, r.overlapped, r.speedup(),
          r.hidden(), r.waiting, r.progressing, r.emulated, r.emulated_share(),
          (unsigned long long)r.wrong);
    }
    std::printf("],\"wrong\":%llu}\n", (unsigned long long)wrong);
  }
  return wrong ? 1 : 0;
}

}  // namespace rlf
