#include "src/app/bench_pipeline_queue.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "kernels/error.h"
#include "mpi_comm/links.h"
#include "mpi_comm/topology.h"
#include "src/app/bench_timing.h"
#include "src/app/integer_list.h"
#include "src/roles/dist_queue.h"
#include "src/roles/long_sequence_batch.h"

namespace rlf {

namespace {

// Rollouts at reasoning-style lengths, short enough that a step's batch stays a few MB.
LongSequenceShape rollout_shape() {
  LongSequenceShape shape;
  shape.prompt = {64, 0.5, 512};
  shape.response = {256, 1.0, 2048};
  return shape;
}

// Sample `base` as copy `copy` of a round whose ids start at `first_id` (batch of `batch`):
// distinct ids per copy, the same content.
QueueSample numbered(const QueueSample& base, int64_t first_id, int copy, int64_t batch) {
  QueueSample s = base;
  s.sample_id = s.prompt_id = first_id + int64_t(copy) * batch + base.sample_id;
  return s;
}

// One step of one way: every rank puts its share (once per copy a replica's ranks need), the
// counters restart, each rank takes its replica's range, and the round's counts come back summed
// over the world, the time as the slowest rank's.
QueueLoadWay round_of(DistQueue& queue, Topology& topology, const ConsecutiveGroups& groups,
                      const std::vector<QueueSample>& batch, bool leader, int64_t first_id) {
  const int world = topology.world_size(), rank = topology.world_rank();
  const int64_t n = int64_t(batch.size());
  const int copies = leader ? 1 : groups.members.size();
  std::vector<QueueSample> mine;
  for (int c = 0; c < copies; ++c) {
    for (int64_t i = n * rank / world; i < n * (rank + 1) / world; ++i) {
      mine.push_back(numbered(batch[size_t(i)], first_id, c, n));
    }
  }
  queue.put(std::move(mine));
  // Every sample stored before any get, and the counters restarted at the same point everywhere.
  queue.barrier();
  queue.reset_counters();
  topology.links().reset_counters();
  queue.barrier();
  const int64_t per_replica = n / groups.groups, begin = per_replica * groups.group;
  const int copy = leader ? 0 : groups.place;
  const double start = steady_seconds();
  const std::vector<QueueSample> got =
      leader ? queue.get_range_replicated(first_id + begin, per_replica, groups.members)
             : queue.get_range(first_id + int64_t(copy) * n + begin, per_replica);
  const double seconds = steady_seconds() - start;
  queue.barrier();
  QueueLoadWay way;
  way.wrong = got.size() == size_t(per_replica) ? 0 : uint64_t(per_replica);
  for (size_t k = 0; k < got.size() && k < size_t(per_replica); ++k) {
    way.wrong += !(got[k] == numbered(batch[size_t(begin) + k], first_id, copy, n));
  }
  const DistQueueCounters& c = queue.counters();
  const LinkCounters& links = topology.links().counters();
  uint64_t counts[6] = {c.get_requests,
                        c.reply_bytes,
                        c.samples_served,
                        links.bytes[size_t(LinkClass::IntraNode)],
                        links.bytes[size_t(LinkClass::InterNode)],
                        way.wrong};
  MPI_Allreduce(MPI_IN_PLACE, counts, 6, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  way.get_requests = counts[0];
  way.reply_bytes = counts[1];
  way.samples_served = counts[2];
  way.intra_node_bytes = counts[3];
  way.inter_node_bytes = counts[4];
  way.wrong = counts[5];
  way.seconds = max_over_world(seconds);
  return way;
}

}  // namespace

std::vector<QueueLayout> parse_queue_layouts(const std::string& text, int world,
                                             bool keep_fitting) {
  std::vector<QueueLayout> layouts;
  if (text == "none") return layouts;
  const std::string usage =
      "--queue-layouts must be 'none' or a comma-separated list of TxP "
      "(tensor x pipeline degrees, e.g. 1x1,2x2), got '" +
      text + "'";
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    const size_t x = item.find('x');
    if (x == std::string::npos) throw ConfigError(usage);
    const std::vector<int> t = parse_integer_list(item.substr(0, x), 1, 4096);
    const std::vector<int> p = parse_integer_list(item.substr(x + 1), 1, 4096);
    if (t.size() != 1 || p.size() != 1) throw ConfigError(usage);
    const QueueLayout layout{t[0], p[0]};
    if (world % layout.group() == 0) {
      layouts.push_back(layout);
    } else if (!keep_fitting) {
      throw ConfigError("--queue-layouts " + item + ": T x P = " + std::to_string(layout.group()) +
                        " must divide the world size " + std::to_string(world));
    }
    at = end + 1;
  }
  return layouts;
}

void validate_queue_load(const QueueLoadOptions& o, const std::vector<QueueLayout>& layouts,
                         int world) {
  if (o.shards < 1) {
    throw ConfigError("--queue-shards must be >= 1, got " + std::to_string(o.shards));
  }
  if (o.samples < 1 || o.samples % world != 0) {
    throw ConfigError("--queue-samples must be a positive multiple of the world size " +
                      std::to_string(world) + ", got " + std::to_string(o.samples));
  }
  for (const QueueLayout& l : layouts) {
    const int replicas = world / l.group();
    if (o.samples % replicas != 0 || o.samples / replicas < o.shards) {
      throw ConfigError("--queue-samples " + std::to_string(o.samples) + " gives layout " +
                        std::to_string(l.tensor) + "x" + std::to_string(l.pipeline) + "'s " +
                        std::to_string(replicas) +
                        " replicas unequal ranges or ranges smaller than the " +
                        std::to_string(o.shards) + " queue shards");
    }
  }
}

bool QueueLoadRow::exact() const {
  const uint64_t g = uint64_t(layout.group());
  return leader.get_requests * g == each.get_requests && leader.reply_bytes * g == each.reply_bytes;
}

std::vector<QueueLoadRow> measure_queue_load(const QueueLoadOptions& o,
                                             const std::vector<QueueLayout>& layouts) {
  std::vector<QueueLoadRow> rows;
  if (layouts.empty()) return rows;
  LayoutConfig config;
  config.fused = true;
  config.queue_shards = o.shards;
  Topology topology(MPI_COMM_WORLD, config);
  const std::vector<QueueSample> batch = long_sequence_batch(rollout_shape(), o.samples, o.seed);
  int largest = 1;
  for (const QueueLayout& l : layouts) largest = std::max(largest, l.group());
  DistQueueConfig queue_config;
  queue_config.shard_capacity =
      std::max<int64_t>(queue_config.shard_capacity, int64_t(largest) * o.samples);
  DistQueue queue(MPI_COMM_WORLD, topology, queue_config);
  int64_t first_id = 0;
  for (const QueueLayout& layout : layouts) {
    ConsecutiveGroups groups =
        split_consecutive_groups(MPI_COMM_WORLD, layout.group(), topology.links());
    QueueLoadRow row;
    row.layout = layout;
    std::vector<double> seconds[2];
    // A warm-up round of each way, then the ways interleaved; every round has fresh ids.
    for (int repeat = -1; repeat < o.repeats; ++repeat) {
      for (int leader = 0; leader < 2; ++leader) {
        QueueLoadWay way = round_of(queue, topology, groups, batch, leader == 1, first_id);
        first_id += int64_t(layout.group()) * o.samples;
        if (repeat < 0) continue;
        seconds[leader].push_back(way.seconds);
        QueueLoadWay& kept = leader ? row.leader : row.each;
        const uint64_t wrong = kept.wrong + way.wrong;
        kept = way;  // the last round's counts (every round moves the same samples)
        kept.wrong = wrong;
      }
    }
    row.each.seconds = median(seconds[0]);
    row.leader.seconds = median(seconds[1]);
    rows.push_back(row);
    free_consecutive_groups(groups);
  }
  queue.close();
  return rows;
}

int print_queue_load(const QueueLoadOptions& o, const std::vector<QueueLoadRow>& rows, int world,
                     bool json) {
  int bad = 0;
  for (const QueueLoadRow& r : rows) bad += !r.exact() || r.each.wrong || r.leader.wrong;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rows.empty() || rank != 0) return bad;
  const LongSequenceShape shape = rollout_shape();
  std::printf(
      "#\n# DistQueue load per layout: a step's %d rollouts (prompt %s, response %s), %d "
      "shards hosted by ranks 0..%d; a model replica = T x P consecutive ranks training one "
      "range of them. each = every rank fetches its own copy (get_range); leader = the "
      "replica's rank 0 fetches once and fans it out inside the replica "
      "(get_range_replicated, as train does). Counts summed over the world; get time = the "
      "slowest rank's, median of %d\n",
      o.samples, shape.prompt.describe().c_str(), shape.response.describe().c_str(), o.shards,
      std::min(o.shards, world) - 1, o.repeats);
  std::printf("# %3s %3s %8s %9s %12s %9s %12s %11s %11s %9s %9s %9s %7s\n", "TP", "PP", "replicas",
              "each", "each", "leader", "leader", "leader", "requests", "each", "leader", "#wrong",
              "exact");
  std::printf("# %3s %3s %8s %9s %12s %9s %12s %11s %11s %9s %9s %9s %7s\n", "", "", "", "(gets)",
              "(reply B)", "(gets)", "(reply B)", "(links B)", "(leader/x)", "(ms)", "(ms)", "",
              "");
  for (const QueueLoadRow& r : rows) {
    std::printf(
        "  %3d %3d %8d %9llu %12llu %9llu %12llu %11llu %11.4f %9.3f %9.3f %9llu %7s\n",
        r.layout.tensor, r.layout.pipeline, world / r.layout.group(),
        (unsigned long long)r.each.get_requests, (unsigned long long)r.each.reply_bytes,
        (unsigned long long)r.leader.get_requests, (unsigned long long)r.leader.reply_bytes,
        (unsigned long long)(r.leader.intra_node_bytes + r.leader.inter_node_bytes),
        r.each.get_requests ? double(r.leader.get_requests) / double(r.each.get_requests) : 0.0,
        r.each.seconds * 1e3, r.leader.seconds * 1e3,
        (unsigned long long)(r.each.wrong + r.leader.wrong), r.exact() ? "yes" : "NO");
  }
  std::printf(
      "# Queue load, leader vs each rank: get requests and reply bytes x 1/(T x P) exactly in "
      "%zu of %zu layouts, every rank's samples the batch's range: %s\n",
      rows.size() - size_t(bad), rows.size(), bad ? "FAIL" : "OK");
  if (json) {
    std::printf(
        "{\"bench\":\"pipeline_queue\",\"ranks\":%d,\"samples\":%d,\"shards\":%d,\"rows\":[", world,
        o.samples, o.shards);
    auto way = [](const QueueLoadWay& w) {
      char text[320];
      std::snprintf(text, sizeof text,
                    "{\"get_requests\":%llu,\"reply_bytes\":%llu,\"samples_served\":%llu,"
                    "\"intra_node_bytes\":%llu,\"inter_node_bytes\":%llu,\"wrong\":%llu,"
                    "\"get_seconds\":%.6e}",
                    (unsigned long long)w.get_requests, (unsigned long long)w.reply_bytes,
                    (unsigned long long)w.samples_served, (unsigned long long)w.intra_node_bytes,
                    (unsigned long long)w.inter_node_bytes, (unsigned long long)w.wrong, w.seconds);
      return std::string(text);
    };
    for (size_t i = 0; i < rows.size(); ++i) {
      const QueueLoadRow& r = rows[i];
      std::printf("%s{\"tensor\":%d,\"pipeline\":%d,\"each\":%s,\"leader\":%s,\"exact\":%s}",
                  i ? "," : "", r.layout.tensor, r.layout.pipeline, way(r.each).c_str(),
                  way(r.leader).c_str(), r.exact() ? "true" : "false");
    }
    std::printf("],\"ok\":%s}\n", bad ? "false" : "true");
  }
  return bad;
}

}  // namespace rlf
