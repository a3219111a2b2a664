// `rlfusion bench queue`: DistQueue's two transfer optimizations on the heavy-tailed rollout
// setting. Part 1: packed (zero-padding) vs padded sample buffers, their exact sizes against the
// formulas of sample_packing.h, pack+unpack time, and the two buffers sent actor -> learner, for
// the task's own (short) samples and for a synthetic batch at long-sequence lengths, with the
// packed / padded ratio swept over the response-length tail.
// Part 2: the queue's load when learners take a step's batch with flat gets vs hierarchical gets
// (one request per node). nccl-tests style: '#' header with units, fixed columns, verdict lines,
// and a --json twin.
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/error.h"
#include "mpi_comm/topology.h"
#include "src/app/bench_timing.h"
#include "src/app/build_info.h"
#include "src/app/commands.h"
#include "src/app/layout_options.h"
#include "src/app/options.h"
#include "src/rl/task.h"
#include "src/rl/tokenizer.h"
#include "src/roles/dist_queue.h"
#include "src/roles/long_sequence_batch.h"
#include "src/roles/sample_packing.h"

namespace rlf {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Collectives that wait with back-off sleeps: Open MPI's blocking calls busy-poll, which would
// steal the core of a rank still measuring.
void wait_request(MPI_Request& request) {
  wait_with_backoff(&request, MPI_STATUS_IGNORE);
}
void idle_barrier(MPI_Comm comm) {
  MPI_Request request;
  MPI_Ibarrier(comm, &request);
  wait_request(request);
}
template <typename T>
void allreduce(std::vector<T>& values, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  MPI_Request request;
  MPI_Iallreduce(MPI_IN_PLACE, values.data(), int(values.size()), type, op, comm, &request);
  wait_request(request);
}
bool all_ranks_true(bool value, MPI_Comm comm) {
  std::vector<int> v{value ? 1 : 0};
  allreduce(v, MPI_INT, MPI_MIN, comm);
  return v[0] == 1;
}

// "0-3,6,8-9": ascending integers as ranges.
std::string ranges(std::vector<int> values) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  std::string text;
  for (size_t i = 0; i < values.size();) {
    size_t j = i;
    while (j + 1 < values.size() && values[j + 1] == values[j] + 1) ++j;
    if (!text.empty()) text += ',';
    text += std::to_string(values[i]);
    if (j > i) {
      text += '-';
      text += std::to_string(values[j]);
    }
    i = j + 1;
  }
  return text.empty() ? "-" : text;
}

std::string comma_list(const std::vector<int>& values) {
  std::string text;
  for (int value : values) {
    if (!text.empty()) text += ',';
    text += std::to_string(value);
  }
  return text;
}

const char* ok_text(bool ok) {
  return ok ? "OK" : "WRONG";
}

// --- samples ------------------------------------------------------------------------------------

// One sample per training prompt 0..count-1 of the task, answered with the reference answer:
// prompt = <bos> + prompt characters, response = answer characters + <eos> (the task's true
// lengths), behaviour log-probs a fixed value, reward 1.
std::vector<QueueSample> reference_batch(const Task& task, int count) {
  constexpr float kBehaviourLogp = -0.6931472f;  // log(1/2)
  std::vector<QueueSample> batch;
  for (int i = 0; i < count; ++i) {
    const TaskSample t = task.train_sample(i);
    QueueSample s;
    s.sample_id = s.prompt_id = i;
    s.reward = 1;
    s.prompt.push_back(Tokenizer::kBos);
    for (int token : Tokenizer::encode(t.prompt)) s.prompt.push_back(token);
    for (int token : Tokenizer::encode(t.answer)) s.response.push_back(token);
    s.response.push_back(Tokenizer::kEos);
    s.behaviour_logp.assign(s.response.size(), kBehaviourLogp);
    batch.push_back(std::move(s));
  }
  return batch;
}

struct LengthStats {
  size_t min = 0, max = 0;
  double mean = 0;
};
LengthStats length_stats(const std::vector<QueueSample>& batch,
                         const std::function<size_t(const QueueSample&)>& length) {
  LengthStats s{length(batch.front()), length(batch.front()), 0};
  for (const auto& x : batch) {
    s.min = std::min(s.min, length(x));
    s.max = std::max(s.max, length(x));
    s.mean += double(length(x)) / double(batch.size());
  }
  return s;
}

// --- part 1: packed vs padded -------------------------------------------------------------------

struct PackRow {
  const char* layout = "";
  uint64_t formula = 0;   // sample_packing.h's formula, computed here from the lengths
  uint64_t function = 0;  // packed_bytes() / padded_bytes()
  uint64_t buffer = 0;    // pack_samples(...).size()
  bool round_trip = false;
  double seconds = 0;  // pack + unpack, median
  bool formula_ok() const { return formula == function && formula == buffer; }
};

// The byte formulas of sample_packing.h, written out again as the benchmark's reference.
uint64_t formula_bytes(const std::vector<QueueSample>& batch, PackLayout layout) {
  uint64_t n = batch.size(), prompt = 0, response = 0, max_prompt = 0, max_response = 0;
  for (const auto& s : batch) {
    prompt += s.prompt.size();
    response += s.response.size();
    max_prompt = std::max<uint64_t>(max_prompt, s.prompt.size());
    max_response = std::max<uint64_t>(max_response, s.response.size());
  }
  if (layout == PackLayout::Packed) return 32 + 48 * n + 4 * (prompt + response) + 4 * response;
  return 32 + 48 * n + 4 * n * (max_prompt + max_response) + 4 * n * max_response;
}

std::vector<PackRow> measure_packing(const std::vector<QueueSample>& batch, int repeats) {
  std::vector<PackRow> rows;
  std::vector<std::function<void()>> bodies;
  for (PackLayout layout : {PackLayout::Packed, PackLayout::Padded}) {
    PackRow row;
    row.layout = layout == PackLayout::Packed ? "packed" : "padded";
    row.formula = formula_bytes(batch, layout);
    row.function = layout == PackLayout::Packed ? packed_bytes(batch) : padded_bytes(batch);
    const auto buffer = pack_samples(batch, layout);
    row.buffer = buffer.size();
    row.round_trip = unpack_samples(buffer) == batch;
    rows.push_back(row);
    bodies.push_back([&batch, layout] {
      const auto restored = unpack_samples(pack_samples(batch, layout));
      if (restored.size() != batch.size()) throw std::logic_error("bench queue: lost samples");
    });
  }
  const auto times = time_interleaved(bodies, repeats);
  for (size_t i = 0; i < rows.size(); ++i) rows[i].seconds = times[i];
  return rows;
}

// Both buffers from the first actor to the first learner with Links::send / recv, each answered
// by a 1-byte ack so the sender's clock covers the whole transfer.
struct WireResult {
  bool measured = false;
  int from = -1, to = -1;
  LinkClass link = LinkClass::IntraNode;
  uint64_t packed_bytes = 0, padded_bytes = 0;
  double packed_seconds = 0, padded_seconds = 0;
  bool intact = true;  // the learner restored the batch from both received buffers
};

WireResult measure_wire(const std::vector<QueueSample>& batch, Topology& topology, MPI_Comm comm,
                        int repeats) {
  WireResult w;
  if (topology.ranks_of(Role::Actor).empty()) return w;
  w.measured = true;
  w.from = topology.ranks_of(Role::Actor).front();
  w.to = topology.ranks_of(Role::Learner).front();
  w.link = topology.links().classify(w.from, w.to);
  const auto packed = pack_samples(batch, PackLayout::Packed);
  const auto padded = pack_samples(batch, PackLayout::Padded);
  w.packed_bytes = packed.size();
  w.padded_bytes = padded.size();
  Links& links = topology.links();
  constexpr int kData = 1, kAck = 2;
  const int me = topology.world_rank();
  std::vector<double> result{0, 0, 0};  // packed seconds, padded seconds, 1 when not intact
  if (me == w.from) {
    std::byte ack{};
    const auto send = [&](const std::vector<std::byte>& buffer) {
      return [&] {
        links.send(buffer.data(), buffer.size(), w.to, kData, comm);
        links.recv(&ack, 1, w.to, kAck, comm);
      };
    };
    const auto times = time_interleaved({send(packed), send(padded)}, repeats);
    result[0] = times[0];
    result[1] = times[1];
  } else if (me == w.to) {
    std::vector<std::byte> received_packed(padded.size()), received_padded(padded.size());
    uint64_t packed_got = 0, padded_got = 0;
    const auto receive = [&](std::vector<std::byte>& buffer, uint64_t& got) {
      return [&] {
        std::byte ack{};
        got = links.recv(buffer.data(), buffer.size(), w.from, kData, comm);
        links.send(&ack, 1, w.from, kAck, comm);
      };
    };
    time_interleaved({receive(received_packed, packed_got), receive(received_padded, padded_got)},
                     repeats);
    received_packed.resize(packed_got);
    received_padded.resize(padded_got);
    const bool intact =
        unpack_samples(received_packed) == batch && unpack_samples(received_padded) == batch;
    result[2] = intact ? 0 : 1;
  }
  allreduce(result, MPI_DOUBLE, MPI_MAX, comm);
  w.packed_seconds = result[0];
  w.padded_seconds = result[1];
  w.intact = result[2] == 0;
  return w;
}

// --- part 2: flat vs hierarchical gets ----------------------------------------------------------

// One round's figures, summed over every rank. Server side: get requests, the messages and bytes
// the queue servers received (the Get messages) and sent (one GetReply per Get; the replies'
// bytes are DistQueue's reply_bytes). Links: every message of the get phase that crossed a link.
enum Count : size_t {
  kGetRequests,
  kServerReceivedMessages,
  kServerReceivedBytes,
  kServerSentBytes,
  kIntraNodeMessages,
  kIntraNodeBytes,
  kInterNodeMessages,
  kInterNodeBytes,
  kSelfMessages,
  kSelfBytes,
  kGetRounds,
  kSamplesTaken,
  kSamplesWrong,
  kCountFields
};

struct ModeResult {
  std::vector<std::vector<uint64_t>> counts;  // one per timed round
  std::vector<double> seconds;                // get phase of each timed round
};

struct QueuePlan {
  std::vector<QueueSample> base;  // the part 2 samples (rounded batch), restamped each round
  int learners = 0, shards = 0;
  int64_t per_learner = 0;
  std::vector<int> group_sizes;  // learners on each node that holds learners
};

QueueSample stamped(const QueueSample& base, int64_t round_samples, int32_t version) {
  QueueSample s = base;
  s.sample_id = s.prompt_id = int64_t(version) * round_samples + base.sample_id;
  s.version_min = s.version_max = version;
  return s;
}

// Actors put the round's samples, learners take them (flat or hierarchical), every rank returns
// the round's counts and the get phase's duration (the slowest learner), summed over ranks.
std::pair<std::vector<uint64_t>, double> queue_round(DistQueue& queue, Topology& topology,
                                                     const QueuePlan& plan, bool hierarchical,
                                                     int32_t version, MPI_Comm comm) {
  const int64_t n = int64_t(plan.base.size());
  const Role role = topology.role();
  if (role == Role::Actor) {
    const auto& actors = topology.ranks_of(Role::Actor);
    const int64_t index =
        std::find(actors.begin(), actors.end(), topology.world_rank()) - actors.begin();
    const int64_t count = int64_t(actors.size());
    std::vector<QueueSample> mine;
    for (int64_t i = n * index / count; i < n * (index + 1) / count; ++i)
      mine.push_back(stamped(plan.base[size_t(i)], n, version));
    queue.put(std::move(mine));
  }
  // Every put is stored once all ranks pass the first barrier; nothing flows between the two,
  // so the counters restart at the same point on every rank.
  queue.barrier();
  queue.reset_counters();
  topology.links().reset_counters();
  queue.barrier();
  double seconds = 0;
  uint64_t wrong = 0, taken = 0;
  if (role == Role::Learner) {
    const auto start = Clock::now();
    const auto got = hierarchical
                         ? queue.get_hierarchical(plan.per_learner, version, topology.role_comm())
                         : queue.get(plan.per_learner, version);
    seconds = seconds_since(start);
    taken = got.size();
    for (const QueueSample& s : got) {
      const int64_t i = s.sample_id - int64_t(version) * n;
      wrong += i < 0 || i >= n || !(s == stamped(plan.base[size_t(i)], n, version));
    }
  }
  queue.barrier();
  const DistQueueCounters& c = queue.counters();
  const LinkCounters& l = topology.links().counters();
  std::vector<uint64_t> counts(kCountFields, 0);
  counts[kGetRequests] = c.get_requests;
  counts[kServerReceivedMessages] = c.server_received.messages;
  counts[kServerReceivedBytes] = c.server_received.bytes;
  counts[kServerSentBytes] = c.reply_bytes;
  counts[kIntraNodeMessages] = l.messages[size_t(LinkClass::IntraNode)];
  counts[kIntraNodeBytes] = l.bytes[size_t(LinkClass::IntraNode)];
  counts[kInterNodeMessages] = l.messages[size_t(LinkClass::InterNode)];
  counts[kInterNodeBytes] = l.bytes[size_t(LinkClass::InterNode)];
  counts[kSelfMessages] = c.self.messages;
  counts[kSelfBytes] = c.self.bytes;
  counts[kGetRounds] = c.get_rounds;
  counts[kSamplesTaken] = taken;
  counts[kSamplesWrong] = wrong;
  allreduce(counts, MPI_UINT64_T, MPI_SUM, comm);
  std::vector<double> slowest{seconds};
  allreduce(slowest, MPI_DOUBLE, MPI_MAX, comm);
  return {counts, slowest[0]};
}

// Flat and hierarchical rounds interleaved (one warm-up round of each first); every round moves
// fresh samples (its own version and sample ids).
std::vector<ModeResult> measure_queue(Topology& topology, const QueuePlan& plan, int repeats,
                                      MPI_Comm comm) {
  DistQueueConfig config;
  config.shard_capacity = std::max<int64_t>(config.shard_capacity, int64_t(plan.base.size()));
  DistQueue queue(MPI_COMM_WORLD, topology, config);
  std::vector<ModeResult> modes(2);
  int32_t version = 0;
  for (int round = -1; round < repeats; ++round) {
    for (int hierarchical = 0; hierarchical < 2; ++hierarchical) {
      auto [counts, seconds] =
          queue_round(queue, topology, plan, hierarchical == 1, ++version, comm);
      if (round < 0) continue;
      modes[size_t(hierarchical)].counts.push_back(std::move(counts));
      modes[size_t(hierarchical)].seconds.push_back(seconds);
    }
  }
  queue.close();
  return modes;
}

// --- where the ranks ran ------------------------------------------------------------------------

struct Placement {
  std::vector<int> cores;       // CPUs in each rank's affinity mask
  std::vector<int> host_of;     // lowest world rank on each rank's host
  std::vector<int> host_cores;  // online CPUs of each rank's host
};

Placement gather_placement(MPI_Comm comm) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MPI_Comm host;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host);
  std::vector<int> lowest{rank};
  allreduce(lowest, MPI_INT, MPI_MIN, host);
  MPI_Comm_free(&host);
  const int mine[3] = {resolve_threads(0), lowest[0], int(sysconf(_SC_NPROCESSORS_ONLN))};
  std::vector<int> all(size_t(size) * 3);
  MPI_Request request;
  MPI_Iallgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, comm, &request);
  wait_request(request);
  Placement p;
  for (int r = 0; r < size; ++r) {
    p.cores.push_back(all[size_t(r) * 3]);
    p.host_of.push_back(all[size_t(r) * 3 + 1]);
    p.host_cores.push_back(all[size_t(r) * 3 + 2]);
  }
  return p;
}

std::string layout_line(const Topology& t) {
  std::string line = "# layout: " + std::to_string(t.world_size()) + " rank(s) on " +
                     std::to_string(t.node_count()) + " node(s)";
  if (t.config().ranks_per_node > 0)
    line += " (virtual, " + std::to_string(t.config().ranks_per_node) + " ranks each)";
  for (Role role : {Role::Learner, Role::Actor, Role::Queue}) {
    const auto& ranks = t.ranks_of(role);
    if (ranks.empty()) continue;
    std::vector<int> nodes;
    for (int r : ranks) nodes.push_back(t.links().node_of(r));
    line += std::string(" | ") + (role == Role::Queue ? "queue ranks" : role_name(role)) +
            (role == Role::Queue ? " " : "s ") + ranges(ranks) + " on node " + ranges(nodes);
  }
  std::vector<int> servers;
  for (int s = 0; s < t.queue_shards(); ++s) servers.push_back(t.queue_server_of_shard(s));
  return line + " | shards 0.." + std::to_string(t.queue_shards() - 1) + " on ranks " +
         comma_list(servers) + "\n";
}

std::string cores_line(const Placement& p) {
  std::map<int, std::vector<int>> ranks_of_host;
  for (size_t r = 0; r < p.host_of.size(); ++r) ranks_of_host[p.host_of[r]].push_back(int(r));
  std::string line;
  for (const auto& [lowest, ranks] : ranks_of_host) {
    std::vector<int> cores;
    for (int r : ranks) cores.push_back(p.cores[size_t(r)]);
    const int host_cores = p.host_cores[size_t(lowest)];
    line += "# cores: ranks " + ranges(ranks) + " on a host of " + std::to_string(host_cores) +
            " cores, " + ranges(cores) + " core(s) in each rank's affinity mask";
    if (int(ranks.size()) > host_cores) {
      line += " -- OVERSUBSCRIBED (" + std::to_string(ranks.size()) +
              " ranks): times are indicative only, counts are exact";
    }
    line += "\n";
  }
  return line;
}

// --- output -------------------------------------------------------------------------------------

// One packing setting: the task's samples or the long-sequence batch.
struct PackSetting {
  std::string name;
  std::vector<QueueSample> batch;
  std::vector<PackRow> rows;  // packed, padded
  WireResult wire;
  double ratio() const { return double(rows[0].buffer) / double(rows[1].buffer); }
  bool formula_ok() const { return rows[0].formula_ok() && rows[1].formula_ok(); }
  bool round_trip_ok() const { return rows[0].round_trip && rows[1].round_trip && wire.intact; }
};

struct Verdicts {
  bool formula = false, round_trip = false, requests = true, delivered = true;
  double ratio = 0;             // long-sequence batch: the setting of the 20% target
  double task_ratio = 0;        // the task's short samples (reported, no target)
  double task_index_share = 0;  // the per-sample index's share of the task's packed bytes
  bool ok() const { return formula && round_trip && requests && delivered; }
};

// One setting's part 1 table: the two layouts' bytes and pack time, then the wire pair.
void print_packing(const std::string& title, const std::vector<PackRow>& pack,
                   const WireResult& wire) {
  std::printf("#\n# Part 1 (%s): packed vs padded batch (every rank packs; rank 0's times)\n",
              title.c_str());
  std::printf("# %-8s %12s %12s %12s %-7s %12s\n", "layout", "formula", "function", "buffer",
              "check", "pack+unpack");
  std::printf("# %-8s %12s %12s %12s %-7s %12s\n", "", "(bytes)", "(bytes)", "(bytes)", "", "(us)");
  for (const PackRow& r : pack) {
    std::printf("  %-8s %12llu %12llu %12llu %-7s %12.1f\n", r.layout,
                (unsigned long long)r.formula, (unsigned long long)r.function,
                (unsigned long long)r.buffer, ok_text(r.formula_ok() && r.round_trip),
                r.seconds * 1e6);
  }
  if (wire.measured) {
    std::printf(
        "#\n# wire: Links::send/recv rank %d (actor) -> rank %d (learner), %s, 1-byte ack\n",
        wire.from, wire.to, link_class_name(wire.link));
    std::printf("# %-8s %12s %12s %10s\n", "layout", "bytes", "time", "rate");
    std::printf("# %-8s %12s %12s %10s\n", "", "", "(us)", "(GB/s)");
    for (auto [name, bytes, seconds] :
         {std::tuple{"packed", wire.packed_bytes, wire.packed_seconds},
          std::tuple{"padded", wire.padded_bytes, wire.padded_seconds}}) {
      std::printf("  %-8s %12llu %12.1f %10.3f\n", name, (unsigned long long)bytes, seconds * 1e6,
                  double(bytes) / seconds / 1e9);
    }
    std::printf("# padded / packed wire time: %.2f\n", wire.padded_seconds / wire.packed_seconds);
  } else {
    std::printf("#\n# wire: not measured (needs an actor and a learner: run with >= 2 ranks)\n");
  }
}

// packed / padded of long-sequence batches whose response tail is heavier or lighter.
struct SweepPoint {
  double sigma = 0;
  uint64_t packed = 0, padded = 0;
  double ratio() const { return double(packed) / double(padded); }
};

std::vector<SweepPoint> sweep_response_tail(const LongSequenceShape& shape, int count,
                                            uint64_t seed) {
  std::vector<SweepPoint> points;
  for (double sigma : {0.25, 0.5, 0.75, 1.0, 1.25, 1.5}) {
    LongSequenceShape s = shape;
    s.response.sigma = sigma;
    const auto batch = long_sequence_batch(s, count, seed);
    points.push_back({sigma, packed_bytes(batch), padded_bytes(batch)});
  }
  return points;
}

void print_sweep(const std::vector<SweepPoint>& sweep, const LongSequenceShape& shape) {
  std::printf(
      "#\n# packed / padded vs the response tail (long-sequence batch, response sigma varied, "
      "median %g, cap %d)\n",
      shape.response.median, shape.response.max);
  std::printf("# %-8s %14s %14s %10s\n", "sigma", "packed", "padded", "ratio");
  std::printf("# %-8s %14s %14s %10s\n", "", "(bytes)", "(bytes)", "(%)");
  for (const SweepPoint& p : sweep) {
    std::printf("  %-8.2f %14llu %14llu %10.1f\n", p.sigma, (unsigned long long)p.packed,
                (unsigned long long)p.padded, 100 * p.ratio());
  }
}

void print_queue_table(const std::vector<ModeResult>& modes, const QueuePlan& plan) {
  if (modes.empty()) {
    std::printf("#\n# Part 2: not run (flat vs hierarchical gets need >= 2 ranks)\n");
    return;
  }
  std::printf(
      "#\n# Part 2: flat vs hierarchical get, %zu samples per round (%lld per learner, %d "
      "learner(s), %d shard(s)); group = learners per node: %s\n",
      plan.base.size(), (long long)plan.per_learner, plan.learners, plan.shards,
      comma_list(plan.group_sizes).c_str());
  if (*std::max_element(plan.group_sizes.begin(), plan.group_sizes.end()) < 2)
    std::printf("# note: fewer than 2 learners per node: hierarchical = flat\n");
  std::printf("# %-12s %8s %8s %10s %8s %10s %10s %10s %8s\n", "mode", "get-req", "recv-msg",
              "recv-bytes", "sent-msg", "sent-bytes", "intra", "inter", "get-time");
  std::printf("# %-12s %8s %8s %10s %8s %10s %10s %10s %8s\n", "", "(server)", "(server)",
              "(server)", "(server)", "(server)", "(bytes)", "(bytes)", "(ms)");
  for (size_t m = 0; m < modes.size(); ++m) {
    const auto& c = modes[m].counts.front();
    std::printf("  %-12s %8llu %8llu %10llu %8llu %10llu %10llu %10llu %8.3f\n",
                m ? "hierarchical" : "flat", (unsigned long long)c[kGetRequests],
                (unsigned long long)c[kServerReceivedMessages],
                (unsigned long long)c[kServerReceivedBytes], (unsigned long long)c[kGetRequests],
                (unsigned long long)c[kServerSentBytes], (unsigned long long)c[kIntraNodeBytes],
                (unsigned long long)c[kInterNodeBytes], median(modes[m].seconds) * 1e3);
  }
}

void print_verdicts(const std::vector<ModeResult>& modes, const QueuePlan& plan,
                    const Verdicts& v) {
  std::printf("#\n# packed bytes equal the formula               : %s\n", ok_text(v.formula));
  std::printf("# unpack restores the batch (memory and wire)  : %s\n", ok_text(v.round_trip));
  std::printf("# packed / padded, long sequences              : %.1f%% (target <= 20%%) %s\n",
              100 * v.ratio, v.ratio <= 0.20 ? "OK" : "ABOVE TARGET");
  std::printf(
      "# packed / padded, task samples                : %.1f%% (no target: short samples, the "
      "48-byte index per sample is %.0f%% of the packed bytes)\n",
      100 * v.task_ratio, 100 * v.task_index_share);
  if (modes.empty()) return;
  const auto flat = modes[0].counts.front()[kGetRequests];
  const auto hier = modes[1].counts.front()[kGetRequests];
  std::printf(
      "# hierarchical get requests = 1/group of flat  : %llu x %d learners = %llu x %zu nodes %s\n",
      (unsigned long long)hier, plan.learners, (unsigned long long)flat, plan.group_sizes.size(),
      ok_text(v.requests));
  std::printf("# samples delivered intact, every round        : %s\n", ok_text(v.delivered));
  std::printf("# get time hierarchical / flat                 : %.2f\n",
              median(modes[1].seconds) / median(modes[0].seconds));
}

// "pack":{...},"wire":{...} of one setting.
void print_json_setting(const PackSetting& setting) {
  std::printf("\"pack\":{");
  for (size_t i = 0; i < setting.rows.size(); ++i) {
    const PackRow& r = setting.rows[i];
    std::printf(
        "%s\"%s_formula_bytes\":%llu,\"%s_function_bytes\":%llu,\"%s_bytes\":%llu,"
        "\"%s_seconds\":%.6e",
        i ? "," : "", r.layout, (unsigned long long)r.formula, r.layout,
        (unsigned long long)r.function, r.layout, (unsigned long long)r.buffer, r.layout,
        r.seconds);
  }
  std::printf(",\"packed_over_padded\":%.6f,\"formula_ok\":%s,\"round_trip_ok\":%s}",
              setting.ratio(), setting.formula_ok() ? "true" : "false",
              setting.round_trip_ok() ? "true" : "false");
  const WireResult& wire = setting.wire;
  if (wire.measured) {
    std::printf(
        ",\"wire\":{\"from\":%d,\"to\":%d,\"link\":\"%s\",\"packed_bytes\":%llu,"
        "\"padded_bytes\":%llu,\"packed_seconds\":%.6e,\"padded_seconds\":%.6e}",
        wire.from, wire.to, link_class_name(wire.link), (unsigned long long)wire.packed_bytes,
        (unsigned long long)wire.padded_bytes, wire.packed_seconds, wire.padded_seconds);
  } else {
    std::printf(",\"wire\":null");
  }
}

void print_json(const std::string& task, int batch, int repeats, const Topology& topology,
                const Placement& placement, const PackSetting& task_setting,
                const PackSetting& long_setting, const LongSequenceShape& shape,
                const std::vector<SweepPoint>& sweep, const std::vector<ModeResult>& modes,
                const QueuePlan& plan, const Verdicts& v) {
  std::printf("{\"bench\":\"queue\",\"task\":\"%s\",\"batch\":%d,\"repeats\":%d,\"ranks\":%d,",
              task.c_str(), batch, repeats, topology.world_size());
  std::printf("\"nodes\":%d,\"roles\":{", topology.node_count());
  for (Role role : {Role::Learner, Role::Actor, Role::Queue}) {
    std::printf("%s\"%s\":[", role == Role::Learner ? "" : ",", role_name(role));
    const auto& ranks = topology.ranks_of(role);
    for (size_t i = 0; i < ranks.size(); ++i) std::printf("%s%d", i ? "," : "", ranks[i]);
    std::printf("]");
  }
  std::printf("},\"cores\":[");
  for (size_t r = 0; r < placement.cores.size(); ++r)
    std::printf("%s%d", r ? "," : "", placement.cores[r]);
  std::printf("],");
  print_json_setting(task_setting);
  std::printf(",\"task_index_share\":%.6f,\"long\":{\"prompt\":\"%s\",\"response\":\"%s\",",
              v.task_index_share, shape.prompt.describe().c_str(),
              shape.response.describe().c_str());
  print_json_setting(long_setting);
  std::printf(",\"sweep\":[");
  for (size_t i = 0; i < sweep.size(); ++i) {
    std::printf(
        "%s{\"response_sigma\":%.2f,\"packed_bytes\":%llu,\"padded_bytes\":%llu,"
        "\"packed_over_padded\":%.6f}",
        i ? "," : "", sweep[i].sigma, (unsigned long long)sweep[i].packed,
        (unsigned long long)sweep[i].padded, sweep[i].ratio());
  }
  std::printf("]}");
  if (modes.empty()) {
    std::printf(",\"queue\":null");
  } else {
    std::printf(
        ",\"queue\":{\"samples\":%zu,\"per_learner\":%lld,\"learners\":%d,\"shards\":%d,"
        "\"learner_nodes\":%zu,\"group\":%.4f",
        plan.base.size(), (long long)plan.per_learner, plan.learners, plan.shards,
        plan.group_sizes.size(), double(plan.learners) / double(plan.group_sizes.size()));
    const char* keys[kCountFields] = {"get_requests",
                                      "server_received_messages",
                                      "server_received_bytes",
                                      "server_sent_bytes",
                                      "intra_node_messages",
                                      "intra_node_bytes",
                                      "inter_node_messages",
                                      "inter_node_bytes",
                                      "self_messages",
                                      "self_bytes",
                                      "get_rounds",
                                      "samples_taken",
                                      "samples_wrong"};
    for (size_t m = 0; m < modes.size(); ++m) {
      const auto& c = modes[m].counts.front();
      std::printf(",\"%s\":{", m ? "hierarchical" : "flat");
      for (size_t k = 0; k < kCountFields; ++k)
        std::printf("%s\"%s\":%llu", k ? "," : "", keys[k], (unsigned long long)c[k]);
      std::printf(",\"server_sent_messages\":%llu,\"get_seconds\":%.6e}",
                  (unsigned long long)c[kGetRequests], median(modes[m].seconds));
    }
    std::printf(",\"requests_ok\":%s,\"delivered_ok\":%s}", v.requests ? "true" : "false",
                v.delivered ? "true" : "false");
  }
  std::printf(",\"ok\":%s}\n", v.ok() ? "true" : "false");
}

// The part 2 plan: the batch rounded down to a multiple of learners x shards, so that every flat
// and hierarchical get is served whole in one round (each shard holds exactly what is asked of
// it) and the request counts are exact.
QueuePlan plan_queue(const std::vector<QueueSample>& batch, const Topology& t) {
  QueuePlan plan;
  plan.learners = int(t.ranks_of(Role::Learner).size());
  plan.shards = t.queue_shards();
  const int64_t unit = int64_t(plan.learners) * plan.shards;
  const int64_t n = int64_t(batch.size()) / unit * unit;
  if (n == 0) {
    throw ConfigError("--batch " + std::to_string(batch.size()) +
                      " is too small for part 2: it needs at least learners x queue shards = " +
                      std::to_string(unit) + " samples");
  }
  plan.base.assign(batch.begin(), batch.begin() + n);
  plan.per_learner = n / plan.learners;
  std::map<int, int> learners_on_node;
  for (int r : t.ranks_of(Role::Learner)) ++learners_on_node[t.links().node_of(r)];
  for (const auto& [node, count] : learners_on_node) plan.group_sizes.push_back(count);
  return plan;
}

const char* kAbout =
    "bench queue: DistQueue transfer on the heavy-tailed setting (a task's prompts answered "
    "with\nthe reference answers). Part 1 (any rank count): packed vs padded buffers of one "
    "batch --\nbytes against the formulas, pack+unpack time, and both buffers sent from the "
    "first actor to\nthe first learner. Part 2 (>= 2 ranks): the queue's load when learners "
    "take a batch with flat\ngets vs hierarchical gets (one request per node), interleaved.\n"
    "\n"
    "Layout: the train rules (learners first, then actors, then queue ranks), except that\n"
    "--actor-fraction defaults to 0 here: one actor puts the batch (the put is not measured) "
    "and\nevery other compute rank is a learner, so learners share nodes as much as the world "
    "allows.\nOn one machine every rank is on one real node (group = all learners); "
    "--ranks-per-node R\nmakes virtual nodes. Part 2 moves the batch rounded down to a multiple "
    "of learners x shards.\nExample: mpiexec -n 6 rlfusion bench queue --ranks-per-node 2 "
    "--queue-ranks 2 --learners 2\n\nbench queue options";

}  // namespace

int run_bench_queue_command(const std::vector<std::string>& args) {
  RunOptions run;
  std::string task_name = "sort-heavytail";
  int batch_size = 256, repeats = 5;
  LayoutConfig layout;
  layout.actor_fraction = 0;
  po::options_description description = run_options_description(run);
  po::options_description bench(kAbout);
  auto add = bench.add_options();
  add("task", po::value(&task_name)->default_value(task_name),
      "task whose prompts and reference answers make the samples");
  add("batch", po::value(&batch_size)->default_value(batch_size), "samples per step (>= 1)");
  add("repeats", po::value(&repeats)->default_value(repeats),
      "timed repeats per case (median reported, >= 3)");
  LongSequenceShape shape;
  for (auto [name, d] : {std::pair{std::string("long-prompt"), &shape.prompt},
                         std::pair{std::string("long-response"), &shape.response}}) {
    add((name + "-median").c_str(), po::value(&d->median)->default_value(d->median),
        "long-sequence batch: median length (tokens)");
    add((name + "-sigma").c_str(), po::value(&d->sigma)->default_value(d->sigma),
        "long-sequence batch: lognormal sigma of the length, in [0, 4]");
    add((name + "-max").c_str(), po::value(&d->max)->default_value(d->max),
        "long-sequence batch: maximum length (tokens)");
  }
  description.add(bench);
  description.add(layout_options_description(layout));
  if (!parse_options("bench queue", args, description, run)) return 0;
  if (repeats < 3) throw ConfigError("--repeats must be >= 3, got " + std::to_string(repeats));
  if (batch_size < 1) throw ConfigError("--batch must be >= 1, got " + std::to_string(batch_size));
  shape.vocab_size = Tokenizer::vocab_size();
  validate_long_sequence_shape(shape);
  const auto task = make_task(load_task_config(task_name, run.seed));
  Topology topology(MPI_COMM_WORLD, layout);
  const bool multi_rank = topology.world_size() > 1;
  PackSetting task_setting{"task samples", reference_batch(*task, batch_size), {}, {}};
  PackSetting long_setting{
      "long sequences", long_sequence_batch(shape, batch_size, run.seed), {}, {}};
  const auto& batch = task_setting.batch;
  const QueuePlan plan = multi_rank ? plan_queue(batch, topology) : QueuePlan{};

  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  const Placement placement = gather_placement(comm);
  const bool root = topology.world_rank() == 0;
  if (root) {
    const auto prompt = length_stats(batch, [](const QueueSample& s) { return s.prompt.size(); });
    const auto response =
        length_stats(batch, [](const QueueSample& s) { return s.response.size(); });
    std::printf("# rlfusion bench queue: %s\n", build_info().c_str());
    std::printf(
        "# task %s (%s, seed %llu), %d samples: prompt %zu..%zu tokens (mean %.2f), response "
        "%zu..%zu tokens (mean %.2f); median of %d repeats, interleaved\n",
        task_name.c_str(), task->name().c_str(), (unsigned long long)run.seed, batch_size,
        prompt.min, prompt.max, prompt.mean, response.min, response.max, response.mean, repeats);
    std::printf("%s%s", layout_line(topology).c_str(), cores_line(placement).c_str());
  }

  for (PackSetting* setting : {&task_setting, &long_setting}) {
    setting->rows = measure_packing(setting->batch, repeats);
    idle_barrier(comm);  // the wire pair then runs alone, not against other ranks' pack timing
    setting->wire = measure_wire(setting->batch, topology, comm, repeats);
  }
  const auto sweep = sweep_response_tail(shape, batch_size, run.seed);
  const auto modes =
      multi_rank ? measure_queue(topology, plan, repeats, comm) : std::vector<ModeResult>{};

  Verdicts v;
  v.formula = all_ranks_true(task_setting.formula_ok() && long_setting.formula_ok(), comm);
  v.round_trip = all_ranks_true(task_setting.round_trip_ok() && long_setting.round_trip_ok(), comm);
  v.ratio = long_setting.ratio();
  v.task_ratio = task_setting.ratio();
  v.task_index_share = double(kPackHeaderBytes + kPackMetadataBytes * batch.size()) /
                       double(task_setting.rows[0].buffer);
  for (size_t r = 0; r < (modes.empty() ? 0 : modes[0].counts.size()); ++r) {
    const auto& flat = modes[0].counts[r];
    const auto& hier = modes[1].counts[r];
    // hierarchical = flat x nodes / learners, exactly (flat / group with equal groups).
    v.requests &= hier[kGetRequests] * uint64_t(plan.learners) ==
                  flat[kGetRequests] * uint64_t(plan.group_sizes.size());
    for (const auto* c : {&flat, &hier}) {
      v.delivered &= (*c)[kSamplesWrong] == 0 && (*c)[kSamplesTaken] == plan.base.size();
    }
  }
  if (root) {
    std::printf("# long sequences: %d synthetic samples, prompt %s, response %s (seed %llu)\n",
                batch_size, shape.prompt.describe().c_str(), shape.response.describe().c_str(),
                (unsigned long long)run.seed);
    print_packing(task_setting.name, task_setting.rows, task_setting.wire);
    print_packing(long_setting.name, long_setting.rows, long_setting.wire);
    print_sweep(sweep, shape);
    print_queue_table(modes, plan);
    print_verdicts(modes, plan, v);
    if (run.json) {
      print_json(task_name, batch_size, repeats, topology, placement, task_setting, long_setting,
                 shape, sweep, modes, plan, v);
    }
    std::fflush(stdout);
  }
  MPI_Comm_free(&comm);
  return v.ok() ? 0 : 1;
}

}  // namespace rlf
