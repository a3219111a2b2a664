// `rlfusion bench allreduce`: the gradient all-reduce's algorithms on the same data, interleaved:
// `shares` (allreduce_sum on nodes of equal size: a reduce-scatter inside the node, a ring per
// share among the nodes, an allgather back), `leaders` (through each node's leader: a binomial tree
// in, a ring among the leaders, a tree out; what allreduce_sum did before, and still does when
// nodes differ in size) and `flat` (one ring over every rank, ignoring nodes).
// nccl-tests style: '#' header with units, fixed columns, a verdict line and a --json twin. Every
// algorithm's result is checked against a float64 sum of every rank's inputs (#wrong beyond a
// float32 tolerance) and for bit-identity on every rank; inside one node `shares` and `leaders`
// must agree bit for bit (both sum in the tree's order).
#include <mpi.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/error.h"
#include "kernels/rng.h"
#include "mpi_comm/hierarchical_collectives.h"
#include "mpi_comm/links.h"
#include "mpi_comm/topology.h"
#include "src/app/bench_timing.h"
#include "src/app/build_info.h"
#include "src/app/commands.h"
#include "src/app/options.h"

namespace rlf {

namespace {

struct AllreduceOptions {
  std::string sizes = "1,16,64";  // MiB of float32 gradients per call
  int ranks_per_node = 0, repeats = 5;
  double inter_bandwidth = 0, inter_latency = 0;
};

using Algorithm = void (*)(float*, int64_t, const HierarchicalComm&, Links&, uint64_t);

struct AlgorithmResult {
  AlgorithmResult(const char* algorithm_name, Algorithm algorithm)
      : name(algorithm_name), run(algorithm) {}
  const char* name;
  Algorithm run;
  double seconds = 0;             // median call, slowest rank
  uint64_t intra = 0, inter = 0;  // bytes per call, summed over ranks
  uint64_t wrong = 0;             // elements off the float64 sum, all ranks
  bool identical_on_every_rank = true;
  bool same_bits_as_leaders = false;  // on every rank
  std::vector<float> result;          // this rank's result of the checked call
};

// Rank r's input: seeded uniform values in [-0.5, 0.5), reproducible on any rank.
float input_value(uint64_t seed, int rank, int64_t i) {
  return philox_uniform(seed, 4000 + uint64_t(rank), uint64_t(i)) - 0.5f;
}

std::vector<int64_t> parse_sizes(const std::string& text) {
  std::vector<int64_t> floats;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    double mib = 0;
    try {
      size_t used = 0;
      mib = std::stod(item, &used);
      if (used != item.size()) mib = 0;
    } catch (const std::exception&) {
      mib = 0;
    }
    if (!(mib > 0) || mib > 4096)
      throw ConfigError("--sizes must be a comma-separated list of MiB in (0, 4096], got '" + text +
                        "'");
    floats.push_back(std::max<int64_t>(1, int64_t(mib * (1 << 20) / sizeof(float))));
    start = end + 1;
  }
  return floats;
}

}  // namespace

int run_bench_allreduce_command(const std::vector<std::string>& args) {
  RunOptions run;
  AllreduceOptions o;
  po::options_description description = run_options_description(run);
  po::options_description bench("bench allreduce options");
  auto add = bench.add_options();
  add("sizes", po::value(&o.sizes)->default_value(o.sizes),
      "MiB of float32 values per call, comma-separated");
  add("ranks-per-node", po::value(&o.ranks_per_node)->default_value(o.ranks_per_node),
      "virtual nodes of this many consecutive ranks (0: the real nodes)");
  add("inter-node-bandwidth", po::value(&o.inter_bandwidth)->default_value(o.inter_bandwidth),
      "emulated inter-node bandwidth in bytes/s (0: not slowed)");
  add("inter-node-latency", po::value(&o.inter_latency)->default_value(o.inter_latency),
      "emulated inter-node latency per message in seconds");
  add("repeats", po::value(&o.repeats)->default_value(o.repeats),
      "timed calls per algorithm and size, interleaved (median reported, >= 3)");
  description.add(bench);
  if (!parse_options("bench allreduce", args, description, run)) return 0;

  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Every check is arithmetic on the options and the world size: the same error on every rank.
  if (o.repeats < 3) throw ConfigError("--repeats must be >= 3, got " + std::to_string(o.repeats));
  const std::vector<int64_t> sizes = parse_sizes(o.sizes);
  LinkEmulation emulation{o.inter_bandwidth, o.inter_latency};
  emulation.validate();
  Links links(node_list(MPI_COMM_WORLD, o.ranks_per_node), emulation);
  HierarchicalComm h = make_hierarchical(MPI_COMM_WORLD, links);
  const int nodes = h.node_count();
  const bool one_node = nodes == 1;  // shares and leaders must then agree bit for bit

  if (rank == 0 && !run.json) {
    std::printf("# rlfusion bench allreduce (%s)\n", build_info().c_str());
    std::printf("# %d ranks on %d node(s) (%s), cores:%s; %d timed calls per algorithm and size\n",
                size, nodes,
                o.ranks_per_node > 0
                    ? ("virtual, " + std::to_string(o.ranks_per_node) + " ranks each").c_str()
                    : "real",
                cpu_lists_of_ranks().c_str(), o.repeats);
  } else {
    cpu_lists_of_ranks();  // collective
  }
  if (rank == 0 && !run.json) {
    std::printf(
        "# algbw = bytes / time; busbw = algbw x 2 (P - 1) / P (nccl-tests); ratio = leaders' "
        "time / this one's\n");
    std::printf("# %10s %-8s %12s %10s %10s %8s %14s %14s %7s %9s %9s\n", "size", "algo", "time",
                "algbw", "busbw", "ratio", "intra bytes", "inter bytes", "#wrong", "all ranks",
                "=leaders");
    std::printf("# %10s %-8s %12s %10s %10s %8s %14s %14s %7s %9s %9s\n", "(MiB)", "", "(ms)",
                "(GB/s)", "(GB/s)", "(x)", "(all ranks)", "(all ranks)", "", "same bits", "(bits)");
  }
  std::string json = "{\"bench\":\"allreduce\",\"ranks\":" + std::to_string(size) +
                     ",\"nodes\":" + std::to_string(nodes) + ",\"rows\":[";
  double largest_ratio = 0;
  bool shares_equal_leaders_everywhere = true;
  for (size_t size_index = 0; size_index < sizes.size(); ++size_index) {
    const int64_t count = sizes[size_index];
    std::vector<float> input(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) input[size_t(i)] = input_value(run.seed, rank, i);
    std::vector<AlgorithmResult> results = {{"shares", allreduce_sum},
                                            {"leaders", allreduce_sum_through_leaders},
                                            {"flat", flat_allreduce_sum}};
    // One checked call each, counted.
    std::vector<double> reference(static_cast<size_t>(count), 0.0);
    for (int r = 0; r < size; ++r)
      for (int64_t i = 0; i < count; ++i) reference[size_t(i)] += input_value(run.seed, r, i);
    for (AlgorithmResult& a : results) {
      a.result = input;
      links.reset_counters();
      a.run(a.result.data(), count, h, links, kDefaultBucketBytes);
      a.intra = sum_over_world(links.counters().bytes[0]);
      a.inter = sum_over_world(links.counters().bytes[1]);
      uint64_t wrong = 0;
      for (int64_t i = 0; i < count; ++i) {
        if (std::abs(double(a.result[size_t(i)]) - reference[size_t(i)]) > 1e-5 * size) ++wrong;
      }
      a.wrong = sum_over_world(wrong);
      std::vector<float> first = a.result;
      MPI_Bcast(first.data(), int(std::min<int64_t>(count, 1 << 30)), MPI_FLOAT, 0, MPI_COMM_WORLD);
      int same = std::memcmp(first.data(), a.result.data(), size_t(count) * sizeof(float)) == 0;
      MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      a.identical_on_every_rank = same != 0;
    }
    for (AlgorithmResult& a : results) {
      int equal = std::memcmp(a.result.data(), results[1].result.data(),
                              size_t(count) * sizeof(float)) == 0;
      MPI_Allreduce(MPI_IN_PLACE, &equal, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      a.same_bits_as_leaders = equal != 0;
    }
    shares_equal_leaders_everywhere =
        shares_equal_leaders_everywhere && results[0].same_bits_as_leaders;
    // Timed calls, interleaved; the data keeps growing by P each call (timing does not depend on
    // the values). `shares` first: on this VM the first body of each round measured up to 30%
    // slower at 200 MiB whichever algorithm it was, so the order is against the new algorithm.
    std::vector<std::vector<float>> work(results.size(), input);
    std::vector<std::function<void()>> bodies;
    for (size_t k = 0; k < results.size(); ++k) {
      bodies.push_back([&, k] {
        MPI_Barrier(MPI_COMM_WORLD);
        results[k].run(work[k].data(), count, h, links, kDefaultBucketBytes);
      });
    }
    const std::vector<double> medians = time_interleaved(bodies, o.repeats);
    const double bytes = double(count) * sizeof(float);
    for (size_t k = 0; k < results.size(); ++k) {
      double seconds = medians[k];
      MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      results[k].seconds = seconds;
    }
    for (const AlgorithmResult& a : results) {
      const double algbw = bytes / a.seconds / 1e9;
      const double busbw = algbw * 2.0 * (size - 1) / size;
      const double ratio = results[1].seconds / a.seconds;
      if (size_index + 1 == sizes.size() && &a == &results[0]) largest_ratio = ratio;
      if (rank == 0 && !run.json) {
        std::printf("  %10.2f %-8s %12.3f %10.3f %10.3f %8.3f %14llu %14llu %7llu %9s %9s\n",
                    bytes / (1 << 20), a.name, 1e3 * a.seconds, algbw, busbw, ratio,
                    (unsigned long long)a.intra, (unsigned long long)a.inter,
                    (unsigned long long)a.wrong, a.identical_on_every_rank ? "yes" : "NO",
                    a.same_bits_as_leaders ? "yes" : "no");
      }
      json += std::string(size_index + (&a - results.data()) ? "," : "") +
              "{\"bytes\":" + std::to_string(int64_t(bytes)) + ",\"algorithm\":\"" + a.name +
              "\",\"seconds\":" + std::to_string(a.seconds) +
              ",\"algbw_gbps\":" + std::to_string(algbw) +
              ",\"busbw_gbps\":" + std::to_string(busbw) +
              ",\"ratio_vs_leaders\":" + std::to_string(ratio) +
              ",\"intra_node_bytes\":" + std::to_string(a.intra) +
              ",\"inter_node_bytes\":" + std::to_string(a.inter) +
              ",\"wrong\":" + std::to_string(a.wrong) +
              ",\"identical_on_every_rank\":" + (a.identical_on_every_rank ? "true" : "false") +
              ",\"same_bits_as_leaders\":" + (a.same_bits_as_leaders ? "true" : "false") + "}";
    }
  }
  json += "],\"largest_shares_over_leaders\":" + std::to_string(largest_ratio) + "}";
  if (rank == 0) {
    if (run.json) {
      std::printf("%s\n", json.c_str());
    } else {
      std::printf("# shares vs leaders at the largest size: %.2fx the speed; results %s\n",
                  largest_ratio,
                  shares_equal_leaders_everywhere ? "bit-identical at every size"
                  : one_node                      ? "DIFFER inside one node (they must not)"
                             : "differ across nodes (the inter-node ring runs per share)");
    }
  }
  free_hierarchical(h);
  return 0;
}

}  // namespace rlf
