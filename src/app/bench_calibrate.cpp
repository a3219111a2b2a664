// `rlfusion bench calibrate`: measures this machine's rates and writes a cluster file for the
// planner (src/sim/cluster.h): the FLOP/s of the runtime's own layers (forward + backward of a
// reference shape) against the rows a call processes (Hockney's peak and half-rate rows), the cpu
// matmul checked against its reference, the cost of a kernel call beyond its work, memory bandwidth
// (copy), and, under mpiexec with 2 ranks, MPI ping-pong between them through the runtime's Links
// (latency from 8-byte messages, bandwidth from 4 MiB ones), once as an intra-node link and, with
// --inter-node-bandwidth or --inter-node-latency, once more through link emulation as the
// inter-node link. Each rank is a device; the host is the same memory (host bandwidth = copy
// bandwidth). Nothing comes from published figures.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "kernels/arena.h"
#include "kernels/device.h"
#include "kernels/error.h"
#include "kernels/linear.h"
#include "kernels/rng.h"
#include "mpi_comm/links.h"
#include "src/app/bench_timing.h"
#include "src/app/build_info.h"
#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/model/transformer.h"
#include "src/sim/cluster.h"
#include "src/sim/cost_model.h"

namespace rlf {

namespace {

double seconds_of(const std::function<void()>& body, int repeats) {
  return time_interleaved({body}, repeats)[0];
}

struct Matmul {
  double rate = 0, nmse = 0;
};

Matmul measure_matmul(Arena& scratch, int repeats) {
  auto filled = [](int n, uint64_t stream) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[size_t(i)] = philox_uniform(7, stream, uint64_t(i)) - 0.5f;
    return v;
  };
  Matmul m;
  {  // correctness at 256^3 against the reference
    const int n = 256;
    const auto a = filled(n * n, 1), w = filled(n * n, 2);
    std::vector<float> fast(static_cast<size_t>(n * n)), ref_out(static_cast<size_t>(n * n));
    cpu::matmul_forward(fast.data(), a.data(), w.data(), n, n, n, scratch);
    ref::matmul_forward(ref_out.data(), a.data(), w.data(), n, n, n);
    double num = 0, den = 0;
    for (size_t i = 0; i < fast.size(); ++i) {
      num += double(fast[i] - ref_out[i]) * (fast[i] - ref_out[i]);
      den += double(ref_out[i]) * ref_out[i];
    }
    m.nmse = num / den;
  }
  // The large-matrix rate, printed for comparison with the layer rates.
  const int n = 1024;
  const auto a = filled(n * n, 3), w = filled(n * n, 4);
  std::vector<float> out(static_cast<size_t>(n) * size_t(n));
  m.rate =
      2.0 * n * n * n /
      seconds_of([&] { cpu::matmul_forward(out.data(), a.data(), w.data(), n, n, n, scratch); },
                 repeats);
  return m;
}

// What a kernel call costs beyond its work, inside the runtime's own layer: the training forward
// of one token through a one-layer model of the smallest shape (d_model 8, 2 experts), divided by
// the cost model's kernel calls for it (kKernelsPerLayer per layer + 3: embedding, final norm,
// head). Arena allocations, routing bookkeeping and dispatch are in it, as in every real call.
double measure_kernel_overhead(Device& device, int repeats) {
  ModelConfig config;
  config.name = "calibrate-micro";
  config.vocab_size = 8;
  config.d_model = 8;
  config.n_layers = 1;
  config.n_heads = 2;
  config.n_experts = 2;
  config.top_k = 1;
  config.d_ff = 8;
  config.max_seq_len = 8;
  Transformer<float> model(config, device.ops(), device.memory(), /*with_gradients=*/false);
  model.initialize(1);
  const int tokens[1] = {1}, offsets[2] = {0, 1};
  const int calls = 200;
  const double seconds = seconds_of(
                             [&] {
                               for (int i = 0; i < calls; ++i) {
                                 model.forward(tokens, offsets, 1);
                                 model.release_activations();
                               }
                             },
                             repeats) /
                         calls;
  return seconds / (config.n_layers * sim::kKernelsPerLayer + 3);
}

struct LayerRates {
  double peak = 0, half_rows = 0;
  std::vector<std::pair<int, double>> measured;  // (rows, FLOP/s)
};

// FLOP/s of the runtime's own layers against the rows (tokens) a call processes: forward +
// backward of a reference model (d_model 128, 2 layers, 8 experts top-2 of width 256 and a shared
// expert; a shape of its own, not one of the validated models) on 1, 4, 16 and 64 sequences of 16
// tokens, FLOPs counted by the cost model's formula, fitted by least squares to Hockney's
// rate(rows) = peak rows / (rows + half_rows), i.e. 1 / rate = 1 / peak + (half_rows / peak) /
// rows.
LayerRates measure_layer_rates(Device& device, int repeats) {
  ModelConfig config;
  config.name = "calibrate-reference";
  config.vocab_size = 64;
  config.d_model = 128;
  config.n_layers = 2;
  config.n_heads = 4;
  config.n_experts = 8;
  config.top_k = 2;
  config.d_ff = 256;
  config.shared_expert_d_ff = 256;
  config.max_seq_len = 64;
  const sim::ModelShape shape = sim::model_shape(config);
  const int length = 16;
  LayerRates r;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (int sequences : {1, 4, 16, 64}) {
    const int tokens = sequences * length;
    const Arena::Mark mark = device.memory().mark();
    double seconds = 0;
    {
      Transformer<float> model(config, device.ops(), device.memory(), /*with_gradients=*/true);
      model.initialize(1);
      std::vector<int> ids(static_cast<size_t>(tokens)), offsets;
      for (int i = 0; i < tokens; ++i) ids[size_t(i)] = (i * 7 + 3) % config.vocab_size;
      for (int q = 0; q <= sequences; ++q) offsets.push_back(q * length);
      const std::vector<float> dlogits(size_t(tokens) * size_t(config.vocab_size), 1.0f / tokens);
      seconds = seconds_of(
          [&] {
            model.forward(ids.data(), offsets.data(), sequences);
            model.backward(dlogits.data(), 0.0f);
          },
          repeats);
    }
    device.memory().release(mark);
    const double rate =
        tokens * sim::forward_flops_per_token(shape, 0.5 * (length + 1)) * 3 / seconds;
    r.measured.push_back({tokens, rate});
    const double x = 1.0 / tokens, y = 1.0 / rate;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double count = double(r.measured.size());
  const double slope = (count * sxy - sx * sy) / (count * sxx - sx * sx);
  const double intercept = (sy - slope * sx) / count;
  if (intercept > 0 && slope >= 0) {
    r.peak = 1.0 / intercept;
    r.half_rows = slope / intercept;
  } else {  // no size dependence to fit (a noisy machine): the best rate at every size
    for (const auto& [rows, rate] : r.measured) r.peak = std::max(r.peak, rate);
  }
  return r;
}

double measure_copy_bandwidth(int repeats) {
  const size_t bytes = size_t(128) << 20;
  std::vector<char> from(bytes, 1), to(bytes, 0);
  const double t = seconds_of([&] { std::memcpy(to.data(), from.data(), bytes); }, repeats);
  return 2.0 * double(bytes) / t;  // read + write
}

struct LinkMeasure {
  double bandwidth = 0, latency = 0;
};

// Ping-pong between world ranks 0 and 1 on two virtual nodes through Links (its counting,
// emulation and back-off waits); medians of the half round trips.
LinkMeasure ping_pong(const LinkEmulation& emulation, int repeats) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<int> nodes(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) nodes[size_t(r)] = r;
  Links links(nodes, emulation);
  auto half_round_trip = [&](uint64_t bytes, int times) {
    std::vector<char> buffer(bytes, 1);
    std::vector<double> samples;
    for (int i = 0; i < times + 1; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      if (rank == 0) {
        links.send(buffer.data(), bytes, 1, 11, MPI_COMM_WORLD);
        links.recv(buffer.data(), bytes, 1, 12, MPI_COMM_WORLD);
      } else if (rank == 1) {
        links.recv(buffer.data(), bytes, 0, 11, MPI_COMM_WORLD);
        links.send(buffer.data(), bytes, 0, 12, MPI_COMM_WORLD);
      }
      if (i > 0) samples.push_back(0.5 * (MPI_Wtime() - start));
    }
    double t = median(samples);
    MPI_Bcast(&t, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return t;
  };
  LinkMeasure m;
  m.latency = half_round_trip(8, 20 * repeats);
  const uint64_t big = uint64_t(4) << 20;
  m.bandwidth = double(big) / std::max(1e-9, half_round_trip(big, repeats) - m.latency);
  return m;
}

}  // namespace

int run_bench_calibrate_command(const std::vector<std::string>& args) {
  RunOptions run;
  std::string output = "runs/calibrate/cluster.ini", name = "calibrated";
  int repeats = 5;
  LinkEmulation emulation;
  po::options_description description = run_options_description(run);
  po::options_description bench("bench calibrate");
  auto add = bench.add_options();
  add("output", po::value(&output)->default_value(output), "cluster file to write");
  add("name", po::value(&name)->default_value(name), "the cluster's name in the file");
  add("repeats", po::value(&repeats)->default_value(repeats), "timed repeats (median, >= 3)");
  add("inter-node-bandwidth", po::value(&emulation.inter_node_bandwidth)->default_value(0),
      "emulated inter-node bandwidth (bytes/s) to measure as the inter-node link");
  add("inter-node-latency", po::value(&emulation.inter_node_latency)->default_value(0),
      "emulated inter-node latency (s)");
  description.add(bench);
  if (!parse_options("bench calibrate", args, description, run)) return 0;
  if (repeats < 3) throw ConfigError("--repeats must be >= 3, got " + std::to_string(repeats));
  emulation.validate();
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (ranks > 2) throw ConfigError("bench calibrate runs on 1 rank, or 2 for the link ping-pong");

  // The device's thread limit holds while it lives: the kernels run on this rank's threads only.
  Device device(Backend::Cpu, run.device_memory_bytes(), resolve_threads(run.threads));
  const Matmul matmul = measure_matmul(device.memory(), repeats);
  const double kernel_overhead = measure_kernel_overhead(device, repeats);
  const LayerRates layers = measure_layer_rates(device, repeats);
  const double copy = measure_copy_bandwidth(repeats);
  sim::ClusterConfig c;
  c.name = name;
  c.devices_per_node = ranks;
  c.nodes_per_supernode = 1;
  c.supernodes = 1;
  c.matmul_flops = layers.peak;
  c.half_rate_rows = layers.half_rows;
  c.kernel_overhead = kernel_overhead;
  c.memory_bytes = double(run.device_memory_bytes());
  c.memory_bandwidth = copy;
  c.host_bandwidth = copy;
  std::string intra_method = "one rank: copy bandwidth, no latency";
  c.intra_node = {copy, 0};
  if (ranks == 2) {
    const LinkMeasure intra = ping_pong(LinkEmulation{}, repeats);
    c.intra_node = {intra.bandwidth, intra.latency};
    intra_method = "MPI ping-pong, 2 ranks, Links";
  }
  c.intra_supernode = c.inter_supernode = c.intra_node;
  std::string inter_method = "no emulation: as intra-node";
  if (ranks == 2 && emulation.enabled()) {
    const LinkMeasure inter = ping_pong(emulation, repeats);
    c.intra_supernode = c.inter_supernode = {inter.bandwidth, inter.latency};
    inter_method = "MPI ping-pong through link emulation";
  }
  if (rank != 0) return 0;
  const bool matmul_ok = matmul.nmse <= 1e-8;
  char comment[512];
  std::snprintf(
      comment, sizeof comment,
      "Written by `rlfusion bench calibrate` (%s): rates measured on this machine, %d "
      "rank(s), %d thread(s) each.\nmatmul_flops: forward + backward of a reference layer "
      "(d_model 128, 8 experts); half size: Hockney fit of 256 x n x n "
      "cpu matmuls, n = 32 .. 1024; kernel overhead "
      "from a 1-token forward of a 1-layer d_model-8 model; copy bandwidth from memcpy of "
      "128 MiB; links: %s; %s.",
      build_info().c_str(), ranks, resolve_threads(run.threads), intra_method.c_str(),
      inter_method.c_str());
  const std::string text = sim::cluster_config_ini(c, comment);
  const std::filesystem::path path(output);
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream(output) << text;
  sim::load_cluster_config(output);  // what was written reads back
  if (run.json) {
    std::printf(
        "{\"command\":\"bench "
        "calibrate\",\"matmul_flops\":%.6g,\"half_rate_rows\":%.6g,\"matmul_nmse\":%.3g,"
        "\"kernel_overhead_s\":%.6g,\"memory_bandwidth\":%.6g,\"intra_node_bandwidth\":%.6g,"
        "\"intra_node_latency_s\":%.6g,\"inter_node_bandwidth\":%.6g,"
        "\"inter_node_latency_s\":%.6g,\"output\":\"%s\",\"ok\":%s}\n",
        c.matmul_flops, c.half_rate_rows, matmul.nmse, c.kernel_overhead, c.memory_bandwidth,
        c.intra_node.bandwidth, c.intra_node.latency, c.inter_supernode.bandwidth,
        c.inter_supernode.latency, output.c_str(), matmul_ok ? "true" : "false");
    return matmul_ok ? 0 : 1;
  }
  std::printf("# rlfusion bench calibrate: %s\n", build_info().c_str());
  std::printf("# %d rank(s), median of %d repeats\n", ranks, repeats);
  std::printf("# %-22s %14s %-8s %s\n", "quantity", "measured", "unit", "method");
  std::printf("  %-22s %14.2f %-8s %s (nmse vs reference %.1e)\n", "matmul 1024^3",
              matmul.rate / 1e9, "GFLOP/s", "cpu kernel, for comparison", matmul.nmse);
  for (const auto& [rows, rate] : layers.measured) {
    char what[64];
    std::snprintf(what, sizeof what, "layers, %d rows", rows);
    std::printf("  %-22s %14.2f %-8s %s\n", what, rate / 1e9, "GFLOP/s",
                "fwd+bwd of the reference model");
  }
  std::printf("  %-22s %14.2f %-8s %s\n", "layer peak (written)", c.matmul_flops / 1e9, "GFLOP/s",
              "Hockney fit of the layer rates");
  std::printf("  %-22s %14.1f %-8s %s\n", "half-rate rows", c.half_rate_rows, "rows",
              "rows at half the peak (same fit)");
  std::printf("  %-22s %14.2f %-8s %s\n", "kernel overhead", c.kernel_overhead * 1e6, "us",
              "1-token forward of a 1-layer d_model-8 model / 21 calls");
  std::printf("  %-22s %14.2f %-8s %s\n", "memory bandwidth", c.memory_bandwidth / 1e9, "GB/s",
              "memcpy 128 MiB, read + write");
  std::printf("  %-22s %14.3f %-8s %s\n", "intra-node bandwidth", c.intra_node.bandwidth / 1e9,
              "GB/s", intra_method.c_str());
  std::printf("  %-22s %14.2f %-8s %s\n", "intra-node latency", c.intra_node.latency * 1e6, "us",
              intra_method.c_str());
  std::printf("  %-22s %14.3f %-8s %s\n", "inter-node bandwidth", c.inter_supernode.bandwidth / 1e9,
              "GB/s", inter_method.c_str());
  std::printf("  %-22s %14.2f %-8s %s\n", "inter-node latency", c.inter_supernode.latency * 1e6,
              "us", inter_method.c_str());
  std::printf("# matmul check: %s; wrote %s (reads back)\n", matmul_ok ? "OK" : "WRONG",
              output.c_str());
  return matmul_ok ? 0 : 1;
}

}  // namespace rlf
