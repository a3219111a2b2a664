// A cluster for the planner (DeployMind): devices per node, nodes per supernode, supernodes, each
// device's compute rate, memory capacity and bandwidth, its link to host memory, and the three link
// levels (inside a node, inside a supernode, between supernodes) as bandwidth per device per
// direction and latency per message. Read from an INI file in inputs/clusters/; written by
// `rlfusion bench calibrate` from rates measured on the machine it runs on.
#pragma once

#include <cstdint>
#include <string>

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
  // Hockney's half-performance rows: a kernel call over r rows (tokens) runs at
  // matmul_flops x r / (r + half_rate_rows) (0: every size at the full rate).
  double half_rate_rows = 0;
  double compute_rate(double rows) const { return matmul_flops * rows / (rows + half_rate_rows); }
  double memory_bytes = 0;      // device memory capacity
  double memory_bandwidth = 0;  // device memory bytes/s (streaming reads + writes)
  double host_bandwidth = 0;    // device <-> host memory bytes/s (offload, onload)
  double kernel_overhead = 0;   // seconds a kernel call costs beyond its work (launch, dispatch)
  Link intra_node, intra_supernode, inter_supernode;

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
