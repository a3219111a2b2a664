#include "src/sim/cluster.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "kernels/error.h"
#include "src/io/input_files.h"

namespace po = boost::program_options;

namespace rlf::sim {
namespace {

// A measured curve's value at `at`, interpolated in log x and log y between its two neighbours
// (log_bracket; clamped to the curve's ends, which hold).
double log_log_value(const std::vector<double>& x, const std::vector<double>& y, double at) {
  size_t i = 0;
  double t = 0;
  log_bracket(x, at, i, t);
  return x.size() == 1 ? y.front() : std::exp((1 - t) * std::log(y[i]) + t * std::log(y[i + 1]));
}

}  // namespace

const Link& ClusterConfig::link(LinkLevel level) const {
  switch (level) {
    case LinkLevel::IntraNode:
      return intra_node;
    case LinkLevel::IntraSupernode:
      return intra_supernode;
    case LinkLevel::InterSupernode:
      break;
  }
  return inter_supernode;
}

LinkLevel ClusterConfig::level_spanned(int64_t group) const {
  if (group <= devices_per_node) return LinkLevel::IntraNode;
  if (group <= devices_per_supernode()) return LinkLevel::IntraSupernode;
  return LinkLevel::InterSupernode;
}

void ClusterConfig::validate(const std::string& source) const {
  auto fail = [&](const std::string& what) { throw ConfigError(source + ": cluster." + what); };
  auto positive_int = [&](int value, const char* key) {
    if (value <= 0)
      fail(std::string(key) + " must be a positive integer, got " + std::to_string(value));
  };
  auto positive = [&](double value, const char* key) {
    if (!(value > 0) || !std::isfinite(value))
      fail(std::string(key) + " must be a positive finite number, got " + std::to_string(value));
  };
  auto non_negative = [&](double value, const char* key) {
    if (!(value >= 0) || !std::isfinite(value))
      fail(std::string(key) + " must be >= 0, got " + std::to_string(value));
  };
  positive_int(devices_per_node, "devices_per_node");
  positive_int(nodes_per_supernode, "nodes_per_supernode");
  positive_int(supernodes, "supernodes");
  positive(matmul_flops, "matmul_flops");
  non_negative(half_rate_rows, "half_rate_rows");
  non_negative(half_rate_width, "half_rate_width");
  positive(decode_flops, "decode_flops");
  non_negative(decode_half_rate_rows, "decode_half_rate_rows");
  non_negative(decode_half_rate_width, "decode_half_rate_width");
  positive(memory_bytes, "memory_bytes");
  positive(memory_bandwidth, "memory_bandwidth");
  positive(host_bandwidth, "host_bandwidth");
  non_negative(kernel_overhead, "kernel_overhead");
  non_negative(row_seconds, "row_seconds");
  if (forward_row_seconds) {
    non_negative(*forward_row_seconds, "forward_row_seconds");
    if (*forward_row_seconds > row_seconds)
      fail(
          "forward_row_seconds must be at most row_seconds (a forward's share of the row work), "
          "got " +
          std::to_string(*forward_row_seconds) + " against " + std::to_string(row_seconds));
  }
  non_negative(expert_exchange_overhead, "expert_exchange_overhead");
  non_negative(expert_exchange_row_seconds, "expert_exchange_row_seconds");
  non_negative(expert_exchange_lockstep, "expert_exchange_lockstep");
  non_negative(expert_exchange_spread, "expert_exchange_spread");
  non_negative(expert_backward_overhead, "expert_backward_overhead");
  non_negative(expert_backward_row_seconds, "expert_backward_row_seconds");
  for (const auto& [handoff, prefix] : {std::pair{&queue_handoff, "queue_handoff_"},
                                        std::pair{&replica_allgather, "replica_allgather_"}}) {
    const std::string key(prefix);
    non_negative(handoff->overhead, (key + "overhead").c_str());
    non_negative(handoff->sample_seconds, (key + "sample_seconds").c_str());
    non_negative(handoff->byte_seconds, (key + "byte_seconds").c_str());
  }
  positive(optimizer_rate, "optimizer_rate");
  positive(sampler_rate, "sampler_rate");
  positive(sampler_sort_rate, "sampler_sort_rate");
  positive(intra_node.bandwidth, "intra_node_bandwidth");
  non_negative(intra_node.latency, "intra_node_latency");
  positive(intra_supernode.bandwidth, "intra_supernode_bandwidth");
  non_negative(intra_supernode.latency, "intra_supernode_latency");
  positive(inter_supernode.bandwidth, "inter_supernode_bandwidth");
  non_negative(inter_supernode.latency, "inter_supernode_latency");
  // A measured curve: points x (positive, strictly ascending) and their values y, as many.
  auto curve = [&](const std::vector<double>& x, const std::vector<double>& y, const char* x_key,
                   const char* y_key, bool y_positive) {
    if (x.size() != y.size())
      fail(std::string(x_key) + " and " + y_key + " must list as many values (" +
           std::to_string(x.size()) + " against " + std::to_string(y.size()) + ")");
    for (size_t i = 0; i < x.size(); ++i) {
      positive(x[i], x_key);
      if (i > 0 && !(x[i] > x[i - 1])) fail(std::string(x_key) + " must be strictly ascending");
      y_positive ? positive(y[i], y_key) : non_negative(y[i], y_key);
    }
  };
  curve(active_expert_bytes, active_expert_seconds, "active_expert_bytes", "active_expert_seconds",
        false);
  curve(sampler_vocab, sampler_row_seconds, "sampler_vocab", "sampler_row_seconds", true);
  curve(optimizer_parameters, optimizer_parameter_seconds, "optimizer_parameters",
        "optimizer_parameter_seconds", true);
  if (!layer_table.empty()) layer_table.validate(source, "layer_rate");
  if (!decode_table.empty()) decode_table.validate(source, "decode_rate");
}

double ClusterConfig::active_expert_call_seconds(double expert_bytes) const {
  const std::vector<double>& x = active_expert_bytes;
  const std::vector<double>& y = active_expert_seconds;
  if (x.empty() || !(expert_bytes > 0)) return 0;
  if (expert_bytes <= x.front()) return y.front();
  if (expert_bytes >= x.back()) return y.back();
  size_t i = 0;
  double t = 0;
  log_bracket(x, expert_bytes, i, t);
  return (1 - t) * y[i] + t * y[i + 1];
}

double ClusterConfig::sampler_seconds(double vocab) const {
  const std::vector<double>& x = sampler_vocab;
  const std::vector<double>& y = sampler_row_seconds;
  if (x.empty()) return sampler_fit_seconds(vocab);
  if (vocab <= x.front())
    return y.front() * sampler_fit_seconds(vocab) / sampler_fit_seconds(x.front());
  if (vocab >= x.back())
    return y.back() * sampler_fit_seconds(vocab) / sampler_fit_seconds(x.back());
  return log_log_value(x, y, vocab);
}

double ClusterConfig::optimizer_seconds(double parameters) const {
  const std::vector<double>& x = optimizer_parameters;
  const std::vector<double>& y = optimizer_parameter_seconds;
  if (x.empty() || !(parameters > 0)) return parameters > 0 ? parameters / optimizer_rate : 0.0;
  return parameters * log_log_value(x, y, parameters);  // the ends held
}

ClusterConfig load_cluster_config(const std::string& name_or_path) {
  const std::string path = resolve_input_file("clusters", name_or_path);
  std::ifstream file(path);
  if (!file)
    throw ConfigError("cluster file '" + path +
                      "' cannot be read (give a path or a name in inputs/clusters/)");
  ClusterConfig c;
  po::options_description desc("cluster");
  auto add = desc.add_options();
  add("cluster.name", po::value(&c.name));
  add("cluster.devices_per_node", po::value(&c.devices_per_node)->required());
  add("cluster.nodes_per_supernode", po::value(&c.nodes_per_supernode)->required());
  add("cluster.supernodes", po::value(&c.supernodes)->required());
  add("cluster.matmul_flops", po::value(&c.matmul_flops)->required());
  add("cluster.half_rate_rows", po::value(&c.half_rate_rows)->required());
  add("cluster.half_rate_width", po::value(&c.half_rate_width)->required());
  add("cluster.decode_flops", po::value(&c.decode_flops)->required());
  add("cluster.decode_half_rate_rows", po::value(&c.decode_half_rate_rows)->required());
  add("cluster.decode_half_rate_width", po::value(&c.decode_half_rate_width)->required());
  add("cluster.memory_bytes", po::value(&c.memory_bytes)->required());
  add("cluster.memory_bandwidth", po::value(&c.memory_bandwidth)->required());
  add("cluster.host_bandwidth", po::value(&c.host_bandwidth)->required());
  add("cluster.kernel_overhead", po::value(&c.kernel_overhead)->required());
  add("cluster.row_seconds", po::value(&c.row_seconds));
  double forward_row_seconds = 0;
  add("cluster.forward_row_seconds", po::value(&forward_row_seconds));
  std::string active_expert_bytes, active_expert_seconds, sampler_vocab, sampler_row_seconds,
      optimizer_parameters, optimizer_parameter_seconds;
  add("cluster.sampler_vocab", po::value(&sampler_vocab));
  add("cluster.sampler_row_seconds", po::value(&sampler_row_seconds));
  add("cluster.optimizer_parameters", po::value(&optimizer_parameters));
  add("cluster.optimizer_parameter_seconds", po::value(&optimizer_parameter_seconds));
  add("cluster.active_expert_bytes", po::value(&active_expert_bytes));
  add("cluster.active_expert_seconds", po::value(&active_expert_seconds));
  add("cluster.optimizer_rate", po::value(&c.optimizer_rate)->required());
  add("cluster.sampler_rate", po::value(&c.sampler_rate)->required());
  add("cluster.sampler_sort_rate", po::value(&c.sampler_sort_rate)->required());
  add("cluster.intra_node_bandwidth", po::value(&c.intra_node.bandwidth)->required());
  add("cluster.intra_node_latency", po::value(&c.intra_node.latency)->required());
  add("cluster.intra_supernode_bandwidth", po::value(&c.intra_supernode.bandwidth)->required());
  add("cluster.intra_supernode_latency", po::value(&c.intra_supernode.latency)->required());
  add("cluster.inter_supernode_bandwidth", po::value(&c.inter_supernode.bandwidth)->required());
  add("cluster.inter_supernode_latency", po::value(&c.inter_supernode.latency)->required());
  add("cluster.expert_exchange_overhead", po::value(&c.expert_exchange_overhead));
  add("cluster.expert_exchange_row_seconds", po::value(&c.expert_exchange_row_seconds));
  add("cluster.expert_exchange_lockstep", po::value(&c.expert_exchange_lockstep));
  add("cluster.expert_exchange_spread", po::value(&c.expert_exchange_spread));
  add("cluster.expert_backward_overhead", po::value(&c.expert_backward_overhead));
  add("cluster.expert_backward_row_seconds", po::value(&c.expert_backward_row_seconds));
  add("cluster.queue_handoff_overhead", po::value(&c.queue_handoff.overhead));
  add("cluster.queue_handoff_sample_seconds", po::value(&c.queue_handoff.sample_seconds));
  add("cluster.queue_handoff_byte_seconds", po::value(&c.queue_handoff.byte_seconds));
  add("cluster.replica_allgather_overhead", po::value(&c.replica_allgather.overhead));
  add("cluster.replica_allgather_sample_seconds", po::value(&c.replica_allgather.sample_seconds));
  add("cluster.replica_allgather_byte_seconds", po::value(&c.replica_allgather.byte_seconds));
  // The optional measured rate grids: rows, widths and rates, all three or none.
  struct TableKeys {
    const char* key;
    RateTable* table;
    std::string rows, widths, rates;
  };
  TableKeys tables[] = {{"layer_rate", &c.layer_table, {}, {}, {}},
                        {"decode_rate", &c.decode_table, {}, {}, {}}};
  for (TableKeys& t : tables) {
    const std::string key = std::string("cluster.") + t.key;
    add((key + "_rows").c_str(), po::value(&t.rows));
    add((key + "_widths").c_str(), po::value(&t.widths));
    add((key + "s").c_str(), po::value(&t.rates));
  }
  try {
    po::variables_map vm;
    po::store(po::parse_config_file(file, desc, /*allow_unregistered=*/false), vm);
    po::notify(vm);
    // Files from before the backward keys: the backward charged as the forward.
    if (!vm.count("cluster.expert_backward_overhead") &&
        !vm.count("cluster.expert_backward_row_seconds")) {
      c.expert_backward_overhead = c.expert_exchange_overhead;
      c.expert_backward_row_seconds = c.expert_exchange_row_seconds;
    }
    if (vm.count("cluster.forward_row_seconds")) c.forward_row_seconds = forward_row_seconds;
    // The measured curves: both lists or neither.
    auto read_curve = [&](const std::string& x_text, const std::string& y_text, const char* x_key,
                          const char* y_key, std::vector<double>& x, std::vector<double>& y) {
      if (x_text.empty() != y_text.empty())
        throw ConfigError("cluster file '" + path + "': cluster." + x_key + " and " + y_key +
                          " come together (both or neither)");
      if (x_text.empty()) return;
      const std::string where = "cluster file '" + path + "': cluster.";
      x = parse_number_list(x_text, where + x_key);
      y = parse_number_list(y_text, where + y_key);
    };
    read_curve(sampler_vocab, sampler_row_seconds, "sampler_vocab", "sampler_row_seconds",
               c.sampler_vocab, c.sampler_row_seconds);
    read_curve(active_expert_bytes, active_expert_seconds, "active_expert_bytes",
               "active_expert_seconds", c.active_expert_bytes, c.active_expert_seconds);
    read_curve(optimizer_parameters, optimizer_parameter_seconds, "optimizer_parameters",
               "optimizer_parameter_seconds", c.optimizer_parameters,
               c.optimizer_parameter_seconds);
    for (TableKeys& t : tables) {
      const std::string where = "cluster file '" + path + "': cluster." + t.key;
      const int given = int(!t.rows.empty()) + int(!t.widths.empty()) + int(!t.rates.empty());
      if (given == 0) continue;
      if (given != 3)
        throw ConfigError(where + "_rows, " + t.key + "_widths and " + t.key +
                          "s come together (all three or none)");
      t.table->rows = parse_number_list(t.rows, where + "_rows");
      t.table->widths = parse_number_list(t.widths, where + "_widths");
      t.table->rates = parse_number_list(t.rates, where + "s");
    }
  } catch (const po::required_option& e) {
    // Files written before a key existed: say how to get one with every key.
    throw ConfigError("cluster file '" + path + "': " + e.what() +
                      " (files written before this key existed: rerun `rlfusion bench calibrate`, "
                      "or add it; docs/DEPLOYMIND.md lists every key)");
  } catch (const po::error& e) {
    throw ConfigError("cluster file '" + path + "': " + e.what());
  }
  if (c.name == "unnamed") c.name = std::filesystem::path(path).stem().string();
  c.validate("cluster file '" + path + "'");
  return c;
}

std::string cluster_config_ini(const ClusterConfig& c, const std::string& comment) {
  std::ostringstream out;
  std::istringstream lines(comment);
  for (std::string line; std::getline(lines, line);) out << "# " << line << "\n";
  char buffer[2048];
  std::snprintf(
      buffer, sizeof buffer,
      "[cluster]\nname = %s\ndevices_per_node = %d\nnodes_per_supernode = %d\n"
      "supernodes = %d\nmatmul_flops = %.6g\nhalf_rate_rows = %.6g\nhalf_rate_width = %.6g\n"
      "decode_flops = %.6g\ndecode_half_rate_rows = %.6g\ndecode_half_rate_width = %.6g\n"
      "memory_bytes = %.6g\nmemory_bandwidth = %.6g\nhost_bandwidth = %.6g\n"
      "kernel_overhead = %.6g\nrow_seconds = %.6g\noptimizer_rate = %.6g\nsampler_rate = %.6g\n"
      "sampler_sort_rate = %.6g\n"
      "intra_node_bandwidth = %.6g\n"
      "intra_node_latency = %.6g\nintra_supernode_bandwidth = %.6g\n"
      "intra_supernode_latency = %.6g\ninter_supernode_bandwidth = %.6g\n"
      "inter_supernode_latency = %.6g\nexpert_exchange_overhead = %.6g\n"
      "expert_exchange_row_seconds = %.6g\nexpert_exchange_lockstep = %.6g\n"
      "expert_exchange_spread = %.6g\nexpert_backward_overhead = %.6g\nexpert_backward_row_seconds "
      "= %.6g\nqueue_handoff_overhead = %.6g\nqueue_handoff_sample_seconds = %.6g\n"
      "queue_handoff_byte_seconds = %.6g\nreplica_allgather_overhead = %.6g\n"
      "replica_allgather_sample_seconds = %.6g\nreplica_allgather_byte_seconds = %.6g\n",
      c.name.c_str(), c.devices_per_node, c.nodes_per_supernode, c.supernodes, c.matmul_flops,
      c.half_rate_rows, c.half_rate_width, c.decode_flops, c.decode_half_rate_rows,
      c.decode_half_rate_width, c.memory_bytes, c.memory_bandwidth, c.host_bandwidth,
      c.kernel_overhead, c.row_seconds, c.optimizer_rate, c.sampler_rate, c.sampler_sort_rate,
      c.intra_node.bandwidth, c.intra_node.latency, c.intra_supernode.bandwidth,
      c.intra_supernode.latency, c.inter_supernode.bandwidth, c.inter_supernode.latency,
      c.expert_exchange_overhead, c.expert_exchange_row_seconds, c.expert_exchange_lockstep,
      c.expert_exchange_spread, c.expert_backward_overhead, c.expert_backward_row_seconds,
      c.queue_handoff.overhead, c.queue_handoff.sample_seconds, c.queue_handoff.byte_seconds,
      c.replica_allgather.overhead, c.replica_allgather.sample_seconds,
      c.replica_allgather.byte_seconds);
  out << buffer;
  if (c.forward_row_seconds) {
    std::snprintf(buffer, sizeof buffer, "forward_row_seconds = %.6g\n", *c.forward_row_seconds);
    out << buffer;
  }
  if (!c.sampler_vocab.empty())
    out << "sampler_vocab = " << number_list(c.sampler_vocab) << "\n"
        << "sampler_row_seconds = " << number_list(c.sampler_row_seconds) << "\n";
  if (!c.active_expert_bytes.empty())
    out << "active_expert_bytes = " << number_list(c.active_expert_bytes) << "\n"
        << "active_expert_seconds = " << number_list(c.active_expert_seconds) << "\n";
  if (!c.optimizer_parameters.empty())
    out << "optimizer_parameters = " << number_list(c.optimizer_parameters) << "\n"
        << "optimizer_parameter_seconds = " << number_list(c.optimizer_parameter_seconds) << "\n";
  const std::pair<const char*, const RateTable*> tables[] = {{"layer_rate", &c.layer_table},
                                                             {"decode_rate", &c.decode_table}};
  for (const auto& [key, table] : tables) {
    if (table->empty()) continue;
    out << key << "_rows = " << number_list(table->rows) << "\n"
        << key << "_widths = " << number_list(table->widths) << "\n"
        << key << "s = " << number_list(table->rates) << "\n";
  }
  return out.str();
}

}  // namespace rlf::sim
