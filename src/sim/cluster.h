// A cluster for the planner (DeployMind): devices per node, nodes per supernode, supernodes, each
// device's compute rate, memory capacity and bandwidth, its link to host memory, and the three link
// levels (inside a node, inside a supernode, between supernodes) as bandwidth per device per
// direction and latency per message. Read from an INI file in inputs/clusters/; written by
// `rlfusion bench calibrate` from rates measured on the machine it runs on.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/sim/rate_table.h"

namespace rlf::sim {

// A link level: bytes per second per device per direction, seconds per message.
struct Link {
  double bandwidth = 0;
  double latency = 0;
  // Seconds to move `bytes` in `messages` messages over this link.
  double seconds(double bytes, double messages = 1) const {
    return bytes / bandwidth + messages * latency;
  }
};

enum class LinkLevel { IntraNode = 0, IntraSupernode = 1, InterSupernode = 2 };

struct ClusterConfig {
  std::string name = "unnamed";
  int devices_per_node = 0;
  int nodes_per_supernode = 0;
  int supernodes = 0;
  // FLOP/s a device sustains running a model's layers (forward and backward: matmuls, attention,
  // experts, counted as the cost model counts FLOPs); a device's peak bounds it.
  double matmul_flops = 0;
  // Hockney's half-performance sizes, in the two dimensions a layer's kernel calls have: r rows
  // (tokens) and width w (the model's FLOP-weighted matrix width, ModelShape::width). A call runs
  // at matmul_flops / (1 + half_rate_rows / r + half_rate_width / w): the fixed per-call work
  // (packing, blocking, tails) is amortized over the rows and over the width (0: no such loss).
  double half_rate_rows = 0;
  double half_rate_width = 0;
  // The layer rates measured on a grid of shapes (optional: a calibrated machine's file has it).
  // Where there is one, a rate inside the grid is interpolated from the measurements and one
  // outside it follows the Hockney law from the nearest grid point; without one, the law alone.
  RateTable layer_table;
  double compute_rate(double rows, double width) const {
    return table_rate(layer_table, rows, width, matmul_flops, half_rate_rows, half_rate_width);
  }
  // The same law for generation's decode steps (forward only, cached attention, one row per
  // sequence), which run at rates of their own.
  double decode_flops = 0;
  double decode_half_rate_rows = 0;
  double decode_half_rate_width = 0;
  RateTable decode_table;
  double decode_rate(double rows, double width) const {
    return table_rate(decode_table, rows, width, decode_flops, decode_half_rate_rows,
                      decode_half_rate_width);
  }
  // Seconds a row (a token) costs in one layer's forward + backward beyond its matmul FLOPs: the
  // norms, residuals and activations, the router's softmax and top-k, the attention's rows, the
  // gathers and scatters of the expert rows: work a row brings whatever its FLOPs. The layer
  // rates time whole layers of reference models at one ratio of FLOPs to rows (d_ff = 2 d_model);
  // a model with fewer FLOPs a row (few or narrow experts) pays that work on fewer FLOPs, so one
  // rate cannot serve both. With this key the layer rates are the FLOPs' own (the row work taken
  // out of the reference models' times) and every training and prefill pass charges its rows'
  // work on top. Optional (0: no row term; the layer rates of older files hold the reference
  // models' row work).
  double row_seconds = 0;
  // The share of that row work a forward alone costs (a prefill, a reference or reward model's
  // forward, a recompute): seconds a row a layer. A forward does more of a row's work than its
  // third of the FLOPs (the norms, the router's softmax and top-k, the attention's softmax run
  // there; their backward is lighter): `tiny`'s forward took 0.37-0.39 of its forward + backward
  // on this machine (2026-12-06), `small`'s, whose FLOPs dominate, 0.34. Optional (absent: a third
  // of row_seconds, as before the key existed); at most row_seconds.
  std::optional<double> forward_row_seconds;
  double forward_row_work() const {
    return forward_row_seconds ? *forward_row_seconds : row_seconds / 3;
  }
  // Seconds an expert that gets rows costs one layer's forward + backward beyond its FLOPs and
  // its rows' work, by the expert's size in bytes (its three matrices): on a CPU its weights are
  // read (and its gradients written) once a call whatever its rows, so at a few rows an expert
  // the number of experts a call touches, more than its FLOPs, sets the expert FFN's time
  // (`small` on this machine, 2026-12-06: 0.5 ms per 1.5 MB expert a layer; its micro-batch of
  // 44 rows ran 2.2x faster with 2 of its 16 experts touched than with 15). Measured at the
  // reference models' expert sizes (ascending), interpolated in log(bytes) between them and held at
  // the ends. With these keys the layer rates are the FLOPs' own (the reference models' touched
  // experts taken out too) and every training, prefill and scoring pass charges its touched experts
  // on top (a third a forward). Optional (empty: no such term; the rates hold the reference models'
  // experts).
  std::vector<double> active_expert_bytes, active_expert_seconds;
  double active_expert_call_seconds(double expert_bytes) const;
  double memory_bytes = 0;      // device memory capacity
  double memory_bandwidth = 0;  // device memory bytes/s (streaming reads + writes)
  double host_bandwidth = 0;    // device <-> host bytes moved per second (offload, onload)
  double kernel_overhead = 0;   // seconds a kernel call costs beyond its work (launch, dispatch)
  // Parameters per second the optimizer step takes: gradient-norm clipping and AdamW's update of
  // the parameter and both moments (memory-bound on an accelerator, bound by its divide and
  // square root per parameter on a CPU).
  double optimizer_rate = 0;
  // The optimizer step's measured seconds a parameter at each calibrated parameter count
  // (ascending): its four float streams (parameters, gradients, both moments) run from the caches
  // while they fit and from memory past them (this VM, one core, 2026-12-06: 8.4-9.1e8
  // parameters/s at 4M, 6.4e8 at 27.84M), so optimizer_seconds interpolates these in log count and
  // log seconds, holding the ends. Optional (both keys or neither; empty: optimizer_rate at every
  // count).
  std::vector<double> optimizer_parameters, optimizer_parameter_seconds;
  // Seconds one optimizer step takes over `parameters` parameters of a device.
  double optimizer_seconds(double parameters) const;
  // The sampler (softmax, sort by probability, top-p, inverse CDF) over one row of V logits:
  // V entries through the softmax and the scans, V log2 V comparisons in the sort.
  double sampler_rate = 0;       // vocabulary entries per second
  double sampler_sort_rate = 0;  // sort comparisons per second
  double sampler_fit_seconds(double vocab) const {
    return vocab / sampler_rate + vocab * std::log2(vocab) / sampler_sort_rate;
  }
  // The sampler's measured seconds a row at each calibrated vocabulary (ascending): the fit's two
  // terms cannot follow the kernel from V = 16 to 4096 (its cost an entry grows with V unevenly;
  // the fitted V = 32 moved 0.95-1.55 us a row between calibrations whose points agreed), so
  // sampler_seconds interpolates these in log V and log seconds, and outside them scales the
  // nearest by the fit. Optional (both keys or neither; empty: the fit alone).
  std::vector<double> sampler_vocab, sampler_row_seconds;
  // Seconds the sampler takes over one row of `vocab` logits.
  double sampler_seconds(double vocab) const;
  Link intra_node, intra_supernode, inter_supernode;
  // An expert-parallel dispatch or combine beyond its link time: routing bookkeeping, counts and
  // metadata, packing and unpacking rows, the split-phase chain. Seconds per operation plus
  // seconds per (token, slot) assignment it handles. Optional keys (0: the link time alone);
  // `bench calibrate` measures them on the runtime's own dispatcher.
  double expert_exchange_overhead = 0;
  double expert_exchange_row_seconds = 0;
  double expert_exchange_seconds(double assignments) const {
    return expert_exchange_overhead + assignments * expert_exchange_row_seconds;
  }
  // The same for their backward (combine_backward, dispatch_backward), which reuse the forward's
  // routing plan. Optional keys; a file without them charges the backward as the forward.
  double expert_backward_overhead = 0;
  double expert_backward_row_seconds = 0;
  double expert_backward_seconds(double assignments) const {
    return expert_backward_overhead + assignments * expert_backward_row_seconds;
  }
  // What an EP exchange costs beyond that when the ranks reach it from equal work of their own,
  // as they do at every MoE layer (lock-step): the spread of equal work's finishing times and the
  // latency of noticing the peer's messages. Seconds per EP operation; optional (0: none), measured
  // by `bench calibrate` on 2 ranks (calibrate_expert_exchange.h).
  double expert_exchange_lockstep = 0;
  // The rest of that cost, which grows with the work before each operation: equal work that
  // streams activations through memory (a layer's forward) finishes further apart on two cores
  // than a product does. A fraction of the work between a run's EP operations, charged on the
  // busiest rank's compute; optional (0: none), measured by `bench calibrate` on 2 ranks after
  // the runtime's forward of a reference model (calibrate_expert_exchange.h).
  double expert_exchange_spread = 0;
  // A model replica's rollout hand-offs in a fused run with pipelines: through DistQueue
  // (`queue_handoff`: pipeline_rollouts' put, barrier, the replica leader's get and fan-out,
  // barrier, and the conversions to and from queue samples) and, with StaleSync, the pools'
  // finished groups allgathered inside the replica (`replica_allgather`: allgather_rollouts).
  // Each costs a fixed part, a part per sample and one per packed byte of the replica's samples:
  // everything on the calibration's link (software, messages, waits). Optional keys
  // queue_handoff_* and replica_allgather_* (0: not charged); `bench calibrate` measures them on 2
  // ranks (calibrate_rollout_handoffs.h).
  struct RolloutHandoff {
    double overhead = 0;        // seconds per hand-off
    double sample_seconds = 0;  // seconds per sample
    double byte_seconds = 0;    // seconds per packed byte
    double seconds(double samples, double packed_bytes) const {
      return overhead + samples * sample_seconds + packed_bytes * byte_seconds;
    }
  };
  RolloutHandoff queue_handoff, replica_allgather;

  static double hockney(double rows, double width, double peak, double half_rows,
                        double half_width) {
    return peak / (1 + half_rows / rows + half_width / width);
  }
  static double table_rate(const RateTable& table, double rows, double width, double peak,
                           double half_rows, double half_width) {
    const double law = hockney(rows, width, peak, half_rows, half_width);
    if (table.empty()) return law;
    const double r = table.clamp_rows(rows), w = table.clamp_width(width);
    return table.at(r, w) * (law / hockney(r, w, peak, half_rows, half_width));
  }

  int devices_per_supernode() const { return devices_per_node * nodes_per_supernode; }
  int devices() const { return devices_per_supernode() * supernodes; }
  const Link& link(LinkLevel level) const;
  // The slowest level a group of `group` consecutive devices spans (nodes filled first).
  LinkLevel level_spanned(int64_t group) const;
  // Throws ConfigError naming `source` and the first impossible field.
  void validate(const std::string& source) const;
};

// Reads `[cluster]` keys; a missing, unknown or malformed key is a ConfigError naming the file and
// the key. `name_or_path`: a path, or a bare name resolved to inputs/clusters/<name>.ini.
ClusterConfig load_cluster_config(const std::string& name_or_path);
// The INI text load_cluster_config reads back to an equal config (every key, `comment` lines
// first as `# ` comments).
std::string cluster_config_ini(const ClusterConfig& cluster, const std::string& comment);

}  // namespace rlf::sim
