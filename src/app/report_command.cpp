// `rlfusion report RUN_DIR`: reads RUN_DIR/trace.h5 and prints throughput per step, each rank's
// time breakdown with a verdict, and bytes per phase (definitions: docs/METRICS.md); `--json`
// prints the same as JSON, `--csv` the breakdown as CSV, `--chrome FILE` also writes the timeline
// for Perfetto / chrome://tracing, `--routing-trace FILE` one layer's router statistics as the
// text `bench balance --routing-trace` replays. Every rank reads (so bad input is a ConfigError on
// every rank); rank 0 prints and writes.
#include <mpi.h>

#include <array>
#include <boost/program_options.hpp>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include "kernels/error.h"
#include "src/app/commands.h"
#include "src/balance/routing_trace.h"
#include "src/io/chrome_trace.h"
#include "src/io/durable_file.h"
#include "src/io/json_text.h"
#include "src/io/router_summary.h"
#include "src/io/trace_reader.h"
#include "src/io/trace_summary.h"

namespace rlf {

namespace {

namespace po = boost::program_options;

std::string format(const char* pattern, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* pattern, ...) {
  char buffer[512];
  va_list args;
  va_start(args, pattern);
  std::vsnprintf(buffer, sizeof buffer, pattern, args);
  va_end(args);
  return buffer;
}

double percent(double part, double whole) {
  return whole > 0 ? 100.0 * part / whole : 0.0;
}

// Mean and worst idle fraction, and the category with the most rank-time.
std::string verdict(const TraceSummary& s) {
  if (s.ranks.empty() || !(s.wall() > 0)) return "no events recorded";
  double idle_sum = 0, idle_max = -1;
  int idle_max_rank = 0;
  std::array<double, kTimeCategoryCount> totals{};
  for (const RankBreakdown& r : s.ranks) {
    const double idle = r.seconds[size_t(TimeCategory::Idle)];
    idle_sum += idle;
    if (idle > idle_max) {
      idle_max = idle;
      idle_max_rank = r.rank;
    }
    for (int c = 0; c < kTimeCategoryCount; ++c) totals[size_t(c)] += r.seconds[size_t(c)];
  }
  int largest = 0;
  for (int c = 1; c < kTimeCategoryCount; ++c) {
    if (totals[size_t(c)] > totals[size_t(largest)]) largest = c;
  }
  const double rank_time = s.wall() * double(s.ranks.size());
  return format(
      "idle (bubble) fraction mean %.1f%%, max %.1f%% on rank %d; most rank-time in %s "
      "(%.1f%%)",
      percent(idle_sum, rank_time), percent(idle_max, s.wall()), idle_max_rank,
      time_category_name(TimeCategory(largest)), percent(totals[size_t(largest)], rank_time));
}

// Router statistics and expert migrations (EDPB), when the run recorded them.
void print_router_text(const TraceData& trace) {
  const std::vector<LayerImbalance> layers = layer_imbalance(trace);
  if (!layers.empty()) {
    std::printf(
        "#\n# expert load per layer: tokens routed to each expert per step, all ranks; max/mean "
        "= busiest expert / mean expert\n");
    std::printf("# %5s %6s %14s %10s %10s %8s %8s\n", "layer", "steps", "assignments", "max/mean",
                "worst", "hottest", "share");
    std::printf("# %5s %6s %14s %10s %10s %8s %8s\n", "", "", "", "(mean)", "(step)", "expert",
                "(%)");
    for (const LayerImbalance& l : layers) {
      std::printf("  %5d %6d %14lld %10.3f %10.3f %8d %8.1f\n", l.layer, l.steps,
                  (long long)l.tokens, l.mean_max_over_mean, l.worst_max_over_mean,
                  l.hottest_expert, 100.0 * l.hottest_share);
    }
    std::printf(
        "# for rlfusion plan: job.router_max_over_mean = %.3f (max/mean averaged over the "
        "layers)\n",
        router_max_over_mean(layers));
  }
  // The experts a training call touched (`train` records it in the metadata since 2026-12-06).
  const auto touched = trace.metadata.find("active_experts_per_call");
  if (touched != trace.metadata.end()) {
    std::printf(
        "# for rlfusion plan: job.active_experts = %s (routed experts a training call gave rows "
        "to, a layer on average)\n",
        touched->second.c_str());
  }
  const std::vector<ExpertMigration> migrations = migrations_of(trace);
  if (!migrations.empty()) {
    std::printf(
        "#\n# expert migrations: (layer, expert) pairs moved, bytes summed over ranks, predicted "
        "max/mean EP-rank load before -> after\n");
    std::printf("# %6s %7s %14s %12s %12s %9s %9s\n", "step", "experts", "bytes", "gain", "cost",
                "before", "after");
    std::printf("# %6s %7s %14s %12s %12s %9s %9s\n", "", "moved", "(B)", "(s)", "(s)", "", "");
    for (const ExpertMigration& m : migrations) {
      std::printf("  %6d %7d %14lld %12.6f %12.6f %9.3f %9.3f\n", m.step, m.experts_moved,
                  (long long)m.bytes, m.predicted_gain_seconds, m.cost_seconds, m.max_mean_before,
                  m.max_mean_after);
    }
    std::printf(
        "# for rlfusion plan: job.expert_moves_per_step = %.6g (pairs moved after the first "
        "migration, over the layers x experts, per step)\n",
        expert_moves_per_step(trace));
  }
}

void print_text(const std::string& path, const TraceData& trace, const TraceSummary& s) {
  std::printf("# rlfusion report: %s\n", path.c_str());
  std::printf("# %d ranks, %zu events, wall %.6f s (first event to last event, all ranks)\n",
              trace.world_size, trace.event_count(), s.wall());
  if (!trace.metadata.empty()) {
    std::printf("# run:");
    for (const auto& [key, value] : trace.metadata)
      std::printf(" %s=%s", key.c_str(), value.c_str());
    std::printf("\n");
  }

  std::printf("#\n# throughput per step: tokens trained / step wall time\n");
  std::printf("# %9s %12s %14s %14s\n", "step", "wall", "tokens", "tokens/s");
  std::printf("# %9s %12s %14s %14s\n", "(version)", "(s)", "(trained)", "(tokens/s)");
  for (const StepThroughput& step : s.steps) {
    std::printf("  %9d %12.6f %14lld %14.1f\n", step.version, step.wall(), (long long)step.tokens,
                step.tokens_per_second());
  }
  if (s.steps.empty()) {
    std::printf("  (no training steps recorded)\n");
  } else {
    std::printf("  %9s %12.6f %14lld %14.1f\n", "total", s.total.wall(), (long long)s.total.tokens,
                s.total.tokens_per_second());
  }

  std::printf("#\n# time per rank: seconds and %% of the wall time (%.6f s)\n", s.wall());
  std::printf("# %5s", "rank");
  for (int c = 0; c < kTimeCategoryCount; ++c) {
    std::printf(" %14s", time_category_name(TimeCategory(c)));
  }
  std::printf(" %10s\n# %5s", "mem-peak", "");
  for (int c = 0; c < kTimeCategoryCount; ++c) std::printf(" %8s %5s", "(s)", "(%)");
  std::printf(" %10s\n", "(MiB)");
  for (const RankBreakdown& r : s.ranks) {
    std::printf("  %5d", r.rank);
    for (double seconds : r.seconds)
      std::printf(" %8.3f %5.1f", seconds, percent(seconds, s.wall()));
    std::printf(" %10.1f\n", double(r.memory_peak_bytes) / 1048576.0);
  }
  std::printf("# verdict: %s\n", verdict(s).c_str());

  if (!s.staleness.empty()) {
    int64_t samples = 0;
    for (const auto& [staleness, count] : s.staleness) samples += count;
    std::printf(
        "#\n# staleness of trained samples: learner version - oldest token's version, all "
        "ranks\n");
    std::printf("# %9s %12s %7s\n", "staleness", "samples", "(%)");
    for (const auto& [staleness, count] : s.staleness) {
      const double share = percent(double(count), double(samples));
      std::printf("  %9d %12lld %7.1f %s\n", staleness, (long long)count, share,
                  std::string(size_t(share / 2.5 + 0.5), '#').c_str());
    }
  }

  if (s.has_link_traffic) {
    std::printf("#\n# bytes sent per link class, each rank over the whole run (exact counters)\n");
    std::printf("# %5s %16s %12s %16s %12s\n", "rank", "intra-node", "messages", "inter-node",
                "messages");
    std::printf("# %5s %16s %12s %16s %12s\n", "", "(B)", "", "(B)", "");
    std::array<int64_t, 2> bytes{}, messages{};
    for (const RankBreakdown& r : s.ranks) {
      std::printf("  %5d %16lld %12lld %16lld %12lld\n", r.rank, (long long)r.link_bytes[0],
                  (long long)r.link_messages[0], (long long)r.link_bytes[1],
                  (long long)r.link_messages[1]);
      for (size_t l = 0; l < 2; ++l) {
        bytes[l] += r.link_bytes[l];
        messages[l] += r.link_messages[l];
      }
    }
    std::printf("  %5s %16lld %12lld %16lld %12lld\n", "total", (long long)bytes[0],
                (long long)messages[0], (long long)bytes[1], (long long)messages[1]);
  }

  print_router_text(trace);

  std::printf("#\n# bytes per phase, all ranks (time: sum of event durations)\n");
  std::printf("# %-15s %8s %12s %14s %16s %10s\n", "phase", "events", "time", "tokens", "bytes",
              "rate");
  std::printf("# %-15s %8s %12s %14s %16s %10s\n", "", "", "(s)", "", "(B)", "(GB/s)");
  for (const PhaseTotal& p : s.phases) {
    std::printf("  %-15s %8lld %12.6f %14lld %16lld %10.3f\n", phase_name(p.phase),
                (long long)p.events, p.seconds, (long long)p.tokens, (long long)p.bytes,
                p.seconds > 0 ? double(p.bytes) / p.seconds / 1e9 : 0.0);
  }
}

// {"version":v,"wall_s":...,"generate_s":...,"train_s":...,"generate_phase_s":...}; the total
// has no version and no per-phase seconds (each step's are its busiest rank's).
std::string json_step(const StepThroughput& step, bool with_version = true) {
  std::string out = with_version ? format("{\"version\":%d,", step.version) : std::string("{");
  out += format("\"wall_s\":%.9g,\"tokens\":%lld,\"tokens_per_s\":%.9g", step.wall(),
                (long long)step.tokens, step.tokens_per_second());
  if (with_version) {
    out += format(",\"generate_s\":%.9g,\"train_s\":%.9g,\"generate_phase_s\":%.9g",
                  step.generate_seconds, step.train_seconds, step.generate_phase_seconds);
  }
  return out + "}";
}

// Comma-separated items of a JSON array or object.
class JsonList {
 public:
  explicit JsonList(std::string& out) : out_(out) {}
  std::string& next() {
    if (!first_) out_ += ',';
    first_ = false;
    return out_;
  }

 private:
  std::string& out_;
  bool first_ = true;
};

void print_json(const std::string& path, const TraceData& trace, const TraceSummary& s) {
  std::string out = "{\"command\":\"report\",\"trace\":";
  out += json_string(path);
  out += format(",\"world_size\":%d,\"events\":%zu,\"wall_s\":%.9g", trace.world_size,
                trace.event_count(), s.wall());
  out += ",\"metadata\":{";
  JsonList metadata(out);
  for (const auto& [key, value] : trace.metadata) {
    metadata.next() += json_string(key);
    out += ':';
    out += json_string(value);
  }
  out += "},\"steps\":[";
  JsonList steps(out);
  for (const StepThroughput& step : s.steps) steps.next() += json_step(step);
  out += "],\"total\":";
  out += s.steps.empty() ? std::string("null") : json_step(s.total, /*with_version=*/false);
  out += ",\"ranks\":[";
  JsonList ranks(out);
  for (const RankBreakdown& r : s.ranks) {
    ranks.next() += format("{\"rank\":%d", r.rank);
    for (int c = 0; c < kTimeCategoryCount; ++c) {
      out += format(",\"%s_s\":%.9g,\"%s_pct\":%.9g", time_category_name(TimeCategory(c)),
                    r.seconds[size_t(c)], time_category_name(TimeCategory(c)),
                    percent(r.seconds[size_t(c)], s.wall()));
    }
    out += format(",\"memory_peak_bytes\":%lld", (long long)r.memory_peak_bytes);
    if (s.has_link_traffic) {
      out += format(
          ",\"intra_node_bytes\":%lld,\"intra_node_messages\":%lld,\"inter_node_bytes\":%lld,"
          "\"inter_node_messages\":%lld",
          (long long)r.link_bytes[0], (long long)r.link_messages[0], (long long)r.link_bytes[1],
          (long long)r.link_messages[1]);
    }
    out += '}';
  }
  out += "],\"staleness\":[";
  JsonList staleness(out);
  for (const auto& [value, count] : s.staleness) {
    staleness.next() += format("{\"staleness\":%d,\"samples\":%lld}", value, (long long)count);
  }
  const std::vector<LayerImbalance> imbalance = layer_imbalance(trace);
  out += format("],\"router_max_over_mean\":%.9g", router_max_over_mean(imbalance));
  out += ",\"router_layers\":[";
  JsonList layers(out);
  for (const LayerImbalance& l : imbalance) {
    layers.next() += format(
        "{\"layer\":%d,\"steps\":%d,\"assignments\":%lld,\"max_over_mean\":%.9g,"
        "\"worst_max_over_mean\":%.9g,\"hottest_expert\":%d,\"hottest_share\":%.9g}",
        l.layer, l.steps, (long long)l.tokens, l.mean_max_over_mean, l.worst_max_over_mean,
        l.hottest_expert, l.hottest_share);
  }
  out += "],\"migrations\":[";
  JsonList migrations(out);
  for (const ExpertMigration& m : migrations_of(trace)) {
    migrations.next() += format(
        "{\"step\":%d,\"experts_moved\":%d,\"bytes\":%lld,\"predicted_gain_s\":%.9g,"
        "\"cost_s\":%.9g,\"max_over_mean_before\":%.9g,\"max_over_mean_after\":%.9g}",
        m.step, m.experts_moved, (long long)m.bytes, m.predicted_gain_seconds, m.cost_seconds,
        m.max_mean_before, m.max_mean_after);
  }
  out += format("],\"expert_moves_per_step\":%.9g", expert_moves_per_step(trace));
  out += ",\"verdict\":";
  out += json_string(verdict(s));
  out += ",\"phases\":[";
  JsonList phases(out);
  for (const PhaseTotal& p : s.phases) {
    phases.next() +=
        format("{\"phase\":\"%s\",\"events\":%lld,\"seconds\":%.9g,\"tokens\":%lld,\"bytes\":%lld}",
               phase_name(p.phase), (long long)p.events, p.seconds, (long long)p.tokens,
               (long long)p.bytes);
  }
  out += "]}\n";
  std::fputs(out.c_str(), stdout);
}

void print_csv(const TraceSummary& s) {
  std::printf("rank,wall_s");
  for (int c = 0; c < kTimeCategoryCount; ++c) {
    std::printf(",%s_s,%s_pct", time_category_name(TimeCategory(c)),
                time_category_name(TimeCategory(c)));
  }
  std::printf(",memory_peak_bytes,intra_node_bytes,inter_node_bytes\n");
  for (const RankBreakdown& r : s.ranks) {
    std::printf("%d,%.9g", r.rank, s.wall());
    for (double seconds : r.seconds) std::printf(",%.9g,%.9g", seconds, percent(seconds, s.wall()));
    std::printf(",%lld,%lld,%lld\n", (long long)r.memory_peak_bytes, (long long)r.link_bytes[0],
                (long long)r.link_bytes[1]);
  }
}

// Where --chrome or --routing-trace will write: its directory must exist (checked before reading
// the trace, so a typo costs nothing).
void check_output_directory(const std::string& option, const std::string& file) {
  const std::filesystem::path parent = std::filesystem::path(file).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent)) {
    throw ConfigError("report: " + option + " " + file + ": directory '" + parent.string() +
                      "' does not exist");
  }
}

// The layer's table, or a ConfigError saying what the trace holds instead.
std::vector<std::vector<double>> routing_table(const TraceData& trace, int layer) {
  const std::vector<int> layers = router_layers(trace);
  if (layers.empty()) {
    throw ConfigError(
        "report: --routing-trace: the trace has no router statistics (`train` runs record "
        "them)");
  }
  std::vector<std::vector<double>> steps = layer_routing(trace, layer);
  if (steps.empty()) {
    std::string present;
    for (int l : layers) present += (present.empty() ? "" : ", ") + std::to_string(l);
    throw ConfigError("report: --routing-layer " + std::to_string(layer) +
                      ": the trace has router statistics for layers " + present);
  }
  if (steps.size() < 2) {
    throw ConfigError("report: --routing-trace: layer " + std::to_string(layer) +
                      " has statistics for 1 step; bench balance replays 2 or more");
  }
  return steps;
}

}  // namespace

int run_report_command(const std::vector<std::string>& args) {
  std::string run_dir;
  bool json = false, csv = false;
  std::string chrome, routing_trace;
  int routing_layer = 0;
  po::options_description description("Report options");
  auto add = description.add_options();
  add("help,h", "print this help and exit");
  add("run-dir", po::value(&run_dir), "the run directory holding trace.h5 (or a trace file)");
  add("json", po::bool_switch(&json), "print the report as JSON instead of tables");
  add("csv", po::bool_switch(&csv), "print the per-rank time breakdown as CSV instead");
  add("chrome", po::value(&chrome)->value_name("FILE"),
      "also write the timeline as Chrome trace JSON to FILE (open in ui.perfetto.dev)");
  add("routing-trace", po::value(&routing_trace)->value_name("FILE"),
      "also write one layer's tokens per expert per step (summed over ranks) to FILE, the text "
      "`bench balance --routing-trace` replays");
  add("routing-layer", po::value(&routing_layer)->default_value(0),
      "the layer --routing-trace writes");
  po::positional_options_description positional;
  positional.add("run-dir", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(description).positional(positional).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: rlfusion report RUN_DIR [--json | --csv] [--chrome FILE] "
                   "[--routing-trace FILE [--routing-layer L]]\n\n"
                << description << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError(std::string(e.what()) + " (see rlfusion report --help)");
  }
  if (run_dir.empty()) throw ConfigError("report needs RUN_DIR (see rlfusion report --help)");
  if (json && csv) throw ConfigError("report: --json and --csv exclude each other");
  if (!std::filesystem::exists(run_dir)) {
    throw ConfigError("report: run directory '" + run_dir + "' does not exist");
  }
  if (!chrome.empty()) check_output_directory("--chrome", chrome);
  if (!routing_trace.empty()) check_output_directory("--routing-trace", routing_trace);
  if (routing_layer < 0) throw ConfigError("report: --routing-layer must be >= 0");
  const std::string path = std::filesystem::is_directory(run_dir) ? run_dir + "/trace.h5" : run_dir;
  const TraceData trace = read_trace(path);
  const TraceSummary summary = summarize(trace);
  const std::vector<std::vector<double>> routing = routing_trace.empty()
                                                       ? std::vector<std::vector<double>>{}
                                                       : routing_table(trace, routing_layer);

  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return 0;
  if (!chrome.empty()) {
    write_chrome_trace(chrome, trace);
    // On stderr, so the JSON and CSV twins stay machine-readable.
    std::fprintf(stderr, "# timeline: %s (%zu events; open in https://ui.perfetto.dev)\n",
                 chrome.c_str(), trace.event_count());
  }
  if (!routing_trace.empty()) {
    write_text_atomically(
        routing_trace,
        routing_trace_text(routing, "router statistics of " + path + ", layer " +
                                        std::to_string(routing_layer) +
                                        ": tokens per expert per step, summed over ranks\n"
                                        "replay: rlfusion bench balance --routing-trace " +
                                        routing_trace));
    std::fprintf(stderr, "# routing trace: %s (layer %d, %zu steps x %zu experts)\n",
                 routing_trace.c_str(), routing_layer, routing.size(), routing.front().size());
  }
  if (json) {
    print_json(path, trace, summary);
  } else if (csv) {
    print_csv(summary);
  } else {
    print_text(path, trace, summary);
  }
  return 0;
}

}  // namespace rlf
