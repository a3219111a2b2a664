// `rlfusion bench a2a`: expert-parallel dispatch/combine, flat (all-to-all-v, one row per
// (token, slot)), flat-dedup (one row per (token, owner rank)) and hierarchical (one row per
// (token, node) across nodes, then forwarding inside the node), interleaved on the same routing.
// nccl-tests style: '#' header with units, fixed columns, verdict lines and a --json twin.
// Inter-node bytes are measured by the Links counters and compared with counts made here from the
// routing alone; every dispatched and combined row is checked against values recomputed from the
// deterministic inputs (#wrong). Link emulation (sleeps) slows inter-node messages and, with
// --intra-node-bandwidth, intra-node ones, so the time ratio reflects the bytes on one machine.
#include <mpi.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

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

namespace rlf {

namespace {

struct A2aOptions {
  // Defaults put the emulated link time at > 90% of the measurement on a 2-core machine running
  // 8 ranks (the CPU work of 8 oversubscribed ranks would otherwise hide the link effect), with
  // the 8:1 intra- to inter-node bandwidth ratio.
  int tokens = 1024, hidden = 256, top_k = 8, experts = 64, ep = 0, ranks_per_node = 0;
  double skew = 0, inter_bandwidth = 5e6, inter_latency = 0, intra_bandwidth = 40e6;
  int repeats = 5;
};

// Inputs are functions of (origin rank, token, ...) so any rank can recompute any row.
float x_value(uint64_t seed, int origin, int token, int c) {
  return philox_uniform(seed, 1000 + uint64_t(origin), uint64_t(token) * 65536 + uint64_t(c)) -
         0.5f;
}
float w_value(uint64_t seed, int origin, int token, int k) {
  return philox_uniform(seed, 2000 + uint64_t(origin), uint64_t(token) * 64 + uint64_t(k));
}

// K distinct experts per token: uniform, or with skew > 0 Zipf-like (p_e ~ 1 / (e + 1)^skew).
std::vector<int> routing_of(uint64_t seed, int origin, const A2aOptions& o) {
  std::vector<double> cdf(size_t(o.experts));
  double total = 0;
  for (int e = 0; e < o.experts; ++e) {
    total += o.skew > 0 ? 1.0 / std::pow(e + 1.0, o.skew) : 1.0;
    cdf[size_t(e)] = total;
  }
  std::vector<int> idx;
  idx.reserve(size_t(o.tokens) * size_t(o.top_k));
  for (int n = 0; n < o.tokens; ++n) {
    uint64_t draw = 0;
    for (int k = 0; k < o.top_k; ++k) {
      int e = 0;
      bool taken = true;
      while (taken) {
        const double u = total * double(philox_uniform(seed, 3000 + uint64_t(origin),
                                                       uint64_t(n) * 4096 + draw++));
        e = int(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
        e = std::min(e, o.experts - 1);
        taken = std::find(idx.end() - k, idx.end(), e) != idx.end();
      }
      idx.push_back(e);
    }
  }
  return idx;
}

struct ModeResult {
  DispatchMode mode;
  std::vector<double> dispatch_s, combine_s, emulated_s;
  uint64_t inter = 0, intra = 0, metadata = 0, expected_rows = 0, wrong = 0;
};

}  // namespace

int run_bench_a2a_command(const std::vector<std::string>& args) {
  RunOptions run;
  A2aOptions o;
  po::options_description description = run_options_description(run);
  po::options_description bench("bench a2a options");
  auto add = bench.add_options();
  add("tokens", po::value(&o.tokens)->default_value(o.tokens), "tokens per rank");
  add("hidden", po::value(&o.hidden)->default_value(o.hidden), "floats per token row (C)");
  add("top-k", po::value(&o.top_k)->default_value(o.top_k), "experts per token (K)");
  add("experts", po::value(&o.experts)->default_value(o.experts), "experts (E)");
  add("ep", po::value(&o.ep)->default_value(o.ep),
      "expert-parallel degree: groups of this many consecutive ranks (0: the world)");
  add("ranks-per-node", po::value(&o.ranks_per_node)->default_value(o.ranks_per_node),
      "virtual nodes of this many consecutive ranks (0: the real nodes)");
  add("skew", po::value(&o.skew)->default_value(o.skew),
      "routing skew: 0 uniform, > 0 Zipf-like hot experts (p ~ 1/(e+1)^skew)");
  add("inter-node-bandwidth", po::value(&o.inter_bandwidth)->default_value(o.inter_bandwidth),
      "emulated inter-node bandwidth in bytes/s (0: not slowed)");
  add("inter-node-latency", po::value(&o.inter_latency)->default_value(o.inter_latency),
      "emulated inter-node latency per message in seconds");
  add("intra-node-bandwidth", po::value(&o.intra_bandwidth)->default_value(o.intra_bandwidth),
      "emulated intra-node bandwidth in bytes/s (0: not slowed); default 8x the inter-node one");
  add("repeats", po::value(&o.repeats)->default_value(o.repeats),
      "timed repeats per mode, interleaved (median reported, >= 3)");
  description.add(bench);
  if (!parse_options("bench a2a", args, description, run)) return 0;

  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Every check is arithmetic on the options and the world size: the same error on every rank.
  if (o.repeats < 3) throw ConfigError("--repeats must be >= 3, got " + std::to_string(o.repeats));
  if (o.tokens < 0 || o.hidden < 1 || o.top_k < 1 || o.top_k > o.experts) {
    throw ConfigError("--tokens must be >= 0, --hidden >= 1 and --top-k in [1, --experts]");
  }
  if (!(o.skew >= 0)) throw ConfigError("--skew must be >= 0");
  const int ep = o.ep == 0 ? size : o.ep;
  validate_expert_parallel(o.experts, ep, size);
  LinkEmulation emulation{o.inter_bandwidth, o.inter_latency};
  emulation.validate();

  Links links(node_list(MPI_COMM_WORLD, o.ranks_per_node), emulation);
  MPI_Comm group;
  MPI_Comm_split(MPI_COMM_WORLD, rank / ep, rank, &group);
  HierarchicalComm h = make_hierarchical(group, links);
  MPI_Comm_free(&group);
  const int ep_rank = h.rank(), group_first = rank - ep_rank;
  const int N = o.tokens, K = o.top_k, C = o.hidden, E = o.experts, E_local = E / ep;
  const uint64_t seed = run.seed;

  // Inputs of this rank and the routing of the whole group (for the checks and the counts).
  std::vector<float> x(size_t(N) * C), w(size_t(N) * K);
  for (int n = 0; n < N; ++n) {
    for (int c = 0; c < C; ++c) x[size_t(n) * C + c] = x_value(seed, rank, n, c);
    for (int k = 0; k < K; ++k) w[size_t(n) * K + k] = w_value(seed, rank, n, k);
  }
  std::vector<int> group_idx;
  for (int r = 0; r < ep; ++r) {
    const std::vector<int> idx = routing_of(seed, group_first + r, o);
    group_idx.insert(group_idx.end(), idx.begin(), idx.end());
  }
  const int* idx = group_idx.data() + size_t(ep_rank) * N * K;

  // Independent counts of inter-node rows: for every token of this rank, its remote nodes,
  // remote owner ranks and slots with a remote owner.
  uint64_t remote_nodes = 0, remote_owners = 0, remote_slots = 0;
  for (int n = 0; n < N; ++n) {
    std::set<int> nodes, owners;
    for (int k = 0; k < K; ++k) {
      const int owner = idx[size_t(n) * K + k] / E_local;
      const int world_owner = h.world_ranks[size_t(owner)];
      if (links.node_of(world_owner) == links.node_of(rank)) continue;
      nodes.insert(links.node_of(world_owner));
      owners.insert(owner);
      ++remote_slots;
    }
    remote_nodes += nodes.size();
    remote_owners += owners.size();
  }
  remote_nodes = sum_over_world(remote_nodes);
  remote_owners = sum_over_world(remote_owners);
  remote_slots = sum_over_world(remote_slots);

  // The canonical rows this rank must receive: the group's routing on one rank.
  const int M_group = ep * N * K;
  std::vector<int> offsets(size_t(E) + 1), row_of(static_cast<size_t>(M_group)),
      token_of(static_cast<size_t>(M_group));
  moe_build_routing(offsets.data(), row_of.data(), token_of.data(), group_idx.data(), ep * N, E, K);
  const int row0 = offsets[size_t(ep_rank * E_local)];

  std::vector<ModeResult> results;
  std::vector<std::unique_ptr<ExpertDispatcher>> dispatchers;
  for (DispatchMode mode :
       {DispatchMode::Flat, DispatchMode::FlatDedup, DispatchMode::Hierarchical}) {
    results.push_back({mode, {}, {}, {}});
    dispatchers.push_back(std::make_unique<ExpertDispatcher>(h, links, E, mode, o.intra_bandwidth));
  }
  results[0].expected_rows = remote_slots;
  results[1].expected_rows = remote_owners;
  results[2].expected_rows = remote_nodes;

  using Clock = std::chrono::steady_clock;
  for (int r = -1; r < o.repeats; ++r) {  // r == -1: warm-up, counted and checked, not timed
    for (size_t i = 0; i < results.size(); ++i) {
      ExpertDispatcher& d = *dispatchers[i];
      ModeResult& res = results[i];
      d.reset_traffic();
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = Clock::now();
      std::vector<float> rows = d.dispatch(x.data(), idx, N, K, C);
      const auto t1 = Clock::now();
      const DispatchTraffic after_dispatch = d.traffic();
      // The test "experts": row times (expert + 1).
      const auto& lo = d.local_expert_offsets();
      for (int e = 0; e < E_local; ++e) {
        const float scale = float(ep_rank * E_local + e + 1);
        for (int64_t m = lo[size_t(e)]; m < lo[size_t(e) + 1]; ++m) {
          for (int c = 0; c < C; ++c) rows[size_t(m) * C + c] *= scale;
        }
      }
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t2 = Clock::now();
      const std::vector<float> out = d.combine(rows.data(), w.data());
      const auto t3 = Clock::now();
      if (r < 0) {
        res.inter = sum_over_world(after_dispatch.payload.bytes[1]);
        res.intra = sum_over_world(after_dispatch.payload.bytes[0]);
        res.metadata =
            sum_over_world(after_dispatch.metadata.bytes[0] + after_dispatch.metadata.bytes[1]);
        // Dispatched rows against the inputs they came from, combined rows against the same
        // arithmetic on this rank's own tokens.
        uint64_t wrong = 0;
        for (int e = 0; e < E_local; ++e) {
          const float scale = float(ep_rank * E_local + e + 1);
          for (int64_t m = lo[size_t(e)]; m < lo[size_t(e) + 1]; ++m) {
            const int global_token = token_of[size_t(row0 + m)];
            const int origin = group_first + global_token / std::max(N, 1);
            bool ok = true;
            for (int c = 0; c < C; ++c) {
              ok &= rows[size_t(m) * C + c] == x_value(seed, origin, global_token % N, c) * scale;
            }
            wrong += !ok;
          }
        }
        for (int n = 0; n < N; ++n) {
          bool ok = true;
          for (int c = 0; c < C; ++c) {
            float s = 0;
            for (int k = 0; k < K; ++k) {
              const float y = x[size_t(n) * C + c] * float(idx[size_t(n) * K + k] + 1);
              s += w[size_t(n) * K + k] * y;
            }
            ok &= out[size_t(n) * C + c] == s;
          }
          wrong += !ok;
        }
        res.wrong = sum_over_world(wrong);
        continue;
      }
      res.dispatch_s.push_back(max_over_world(std::chrono::duration<double>(t1 - t0).count()));
      res.combine_s.push_back(max_over_world(std::chrono::duration<double>(t3 - t2).count()));
      res.emulated_s.push_back(max_over_world(after_dispatch.emulated_seconds));
    }
  }
  dispatchers.clear();
  free_hierarchical(h);

  const double row_bytes = double(C) * sizeof(float);
  const double dispatched_bytes = double(N) * K * row_bytes;  // per rank
  if (rank == 0) {
    std::printf("# rlfusion bench a2a: %s\n", build_info().c_str());
    std::printf(
        "# %d ranks, EP %d, %d nodes, tokens/rank %d, hidden %d, top-k %d, experts %d, skew %g\n",
        size, ep, links.node_of(size - 1) + 1, N, C, K, E, o.skew);
    std::printf(
        "# emulation: inter-node %.3g B/s + %.3g s/message, intra-node %.3g B/s (0: not slowed); "
        "median of %d interleaved repeats, time = slowest rank\n",
        o.inter_bandwidth, o.inter_latency, o.intra_bandwidth, o.repeats);
    std::printf(
        "# bytes: dispatch row payload summed over all ranks; expected = rows counted "
        "from the routing x %d B\n#\n",
        int(row_bytes));
    std::printf("# %-13s %10s %9s %14s %14s %14s %11s %10s %7s\n", "mode", "dispatch", "algbw",
                "inter-node", "inter expected", "intra-node", "metadata", "combine", "#wrong");
    std::printf("# %-13s %10s %9s %14s %14s %14s %11s %10s %7s\n", "", "(ms)", "(GB/s)", "(B)",
                "(B)", "(B)", "(B)", "(ms)", "");
    for (const ModeResult& r : results) {
      const double t = median(r.dispatch_s);
      std::printf("  %-13s %10.2f %9.3f %14llu %14llu %14llu %11llu %10.2f %7llu\n",
                  dispatch_mode_name(r.mode), t * 1e3, dispatched_bytes / t / 1e9,
                  (unsigned long long)r.inter,
                  (unsigned long long)(r.expected_rows * uint64_t(row_bytes)),
                  (unsigned long long)r.intra, (unsigned long long)r.metadata,
                  median(r.combine_s) * 1e3, (unsigned long long)r.wrong);
    }
  }
  const ModeResult &flat = results[0], &dedup = results[1], &hier = results[2];
  const double cut = hier.inter ? double(flat.inter) / double(hier.inter) : 0;
  const double cut_expected =
      hier.expected_rows ? double(flat.expected_rows) / double(hier.expected_rows) : 0;
  const double cut_dedup = hier.inter ? double(dedup.inter) / double(hier.inter) : 0;
  const double ratio = median(hier.dispatch_s) / median(flat.dispatch_s);
  const double share_flat = median(flat.emulated_s) / median(flat.dispatch_s);
  const double share_hier = median(hier.emulated_s) / median(hier.dispatch_s);
  uint64_t wrong = 0;
  bool bytes_match = true;
  for (const ModeResult& r : results) {
    wrong += r.wrong;
    bytes_match &= r.inter == r.expected_rows * uint64_t(row_bytes);
  }
  if (rank == 0) {
    std::printf("#\n# Rows checked                         : %llu wrong %s\n",
                (unsigned long long)wrong, wrong ? "FAIL" : "OK");
    std::printf("# Inter-node bytes = routing count     : %s\n", bytes_match ? "OK" : "MISMATCH");
    std::printf(
        "# Inter-node cut flat/hierarchical     : %.2fx measured, %.2fx expected "
        "(~2.2x at top-8 of 64 experts on 4 nodes); flat-dedup/hierarchical %.2fx\n",
        cut, cut_expected, cut_dedup);
    std::printf(
        "# Dispatch time hierarchical/flat      : %.2fx (target <= 0.7x) %s; emulated link time "
        "share flat %.0f%%, hierarchical %.0f%%\n",
        ratio, ratio <= 0.7 ? "OK" : "ABOVE TARGET", 100 * share_flat, 100 * share_hier);
    std::printf(
        "# Combine returns one row per (token, slot) in every mode (slot-order sum, bit-exact): "
        "its inter-node bytes are the flat ones\n");
  }
  if (run.json && rank == 0) {
    std::printf(
        "{\"bench\":\"a2a\",\"ranks\":%d,\"ep\":%d,\"nodes\":%d,\"tokens\":%d,\"hidden\":%d,"
        "\"top_k\":%d,\"experts\":%d,\"skew\":%g,\"inter_node_bandwidth\":%g,"
        "\"intra_node_bandwidth\":%g,\"rows\":[",
        size, ep, links.node_of(size - 1) + 1, N, C, K, E, o.skew, o.inter_bandwidth,
        o.intra_bandwidth);
    for (size_t i = 0; i < results.size(); ++i) {
      const ModeResult& r = results[i];
      const double t = median(r.dispatch_s);
      std::printf(
          "%s{\"mode\":\"%s\",\"dispatch_seconds\":%.6e,\"algbw_gbs\":%.4f,"
          "\"inter_node_bytes\":%llu,\"inter_node_bytes_expected\":%llu,\"intra_node_bytes\":%llu,"
          "\"metadata_bytes\":%llu,\"combine_seconds\":%.6e,\"emulated_share\":%.4f,"
          "\"wrong\":%llu}",
          i ? "," : "", dispatch_mode_name(r.mode), t, dispatched_bytes / t / 1e9,
          (unsigned long long)r.inter, (unsigned long long)(r.expected_rows * uint64_t(row_bytes)),
          (unsigned long long)r.intra, (unsigned long long)r.metadata, median(r.combine_s),
          median(r.emulated_s) / t, (unsigned long long)r.wrong);
    }
    std::printf(
        "],\"inter_node_cut\":%.4f,\"inter_node_cut_expected\":%.4f,\"time_ratio\":%.4f,"
        "\"wrong\":%llu}\n",
        cut, cut_expected, ratio, (unsigned long long)wrong);
  }
  return wrong || !bytes_match ? 1 : 0;
}

}  // namespace rlf
