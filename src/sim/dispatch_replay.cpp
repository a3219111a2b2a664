#include "src/sim/dispatch_replay.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/routing_log.h"

namespace rlf::sim {
namespace {

// A dispatch's count message to each peer of each of its stages: packets and assignments, int32.
constexpr uint64_t kCountBytes = 8;
// A packet's metadata: origin, token and its assignment count; then (slot, expert) per assignment.
constexpr uint64_t kPacketMetaBytes = 12, kAssignmentMetaBytes = 8;
constexpr uint64_t kScalarBytes = 4;  // an expert weight or its gradient, per assignment

// One dispatcher as its rank's log describes it, with the plan of its last dispatch.
struct Group {
  DispatchMode mode = DispatchMode::Flat;
  int P = 0, me = 0, experts = 0, slots_per_rank = 0;
  std::vector<int> links_node, node, local;  // per EP rank
  std::vector<std::vector<int>> rank_at;     // [node][local index] -> EP rank
  std::vector<std::vector<int>> replicas;    // expert -> its slots, ascending
  // The last dispatch's flows over both stages: packets and assignments [sender * P + receiver].
  std::vector<int64_t> packets, assignments;
  uint64_t row_bytes = 0;
  bool planned = false;

  int owner(int slot) const { return slot / slots_per_rank; }
  void flow(int sender, int receiver, int64_t packet_count, int64_t assignment_count) {
    packets[size_t(sender * P + receiver)] += packet_count;
    assignments[size_t(sender * P + receiver)] += assignment_count;
  }
};

class Reader {
 public:
  Reader(const std::vector<int32_t>& log, int rank) : log_(log), rank_(rank) {}
  bool done() const { return at_ >= log_.size(); }
  size_t remaining() const { return log_.size() - at_; }
  int32_t next() {
    if (done()) fail("the log ends inside a record");
    return log_[at_++];
  }
  // The next value, checked to lie in [low, high].
  int32_t next_in(int32_t low, int32_t high, const char* what) {
    const int32_t value = next();
    if (value < low || value > high) {
      fail(std::string(what) + " " + std::to_string(value) + " outside [" + std::to_string(low) +
           ", " + std::to_string(high) + "]");
    }
    return value;
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error("the routing log of rank " + std::to_string(rank_) + ", value " +
                             std::to_string(at_) + ": " + why);
  }

 private:
  const std::vector<int32_t>& log_;
  size_t at_ = 0;
  int rank_;
};

constexpr int32_t kLargest = 1 << 30;

// An EP group holds at most the world's ranks, and its slot table (every expert in a slot) follows
// in the log: the bounds keep a damaged log from sizing the tables beyond what it could describe.
Group read_dispatcher(Reader& in, int world_size) {
  Group g;
  g.mode = DispatchMode(in.next_in(0, 2, "dispatch mode"));
  g.P = in.next_in(1, world_size, "EP size");
  g.me = in.next_in(0, g.P - 1, "EP rank");
  const int32_t values_left = int32_t(std::min<size_t>(in.remaining(), kLargest));
  g.experts = in.next_in(1, values_left, "experts");
  g.slots_per_rank = in.next_in(1, values_left / g.P, "slots per rank");
  if (g.experts > g.P * g.slots_per_rank) in.fail("more experts than slots");
  for (int r = 0; r < g.P; ++r) g.links_node.push_back(in.next_in(0, kLargest, "links node"));
  for (std::vector<int>* list : {&g.node, &g.local}) {
    for (int r = 0; r < g.P; ++r) list->push_back(in.next_in(0, g.P - 1, "node or local index"));
  }
  for (int r = 0; r < g.P; ++r) {
    const size_t node = size_t(g.node[size_t(r)]), local = size_t(g.local[size_t(r)]);
    if (g.rank_at.size() <= node) g.rank_at.resize(node + 1);
    std::vector<int>& ranks = g.rank_at[node];
    if (ranks.size() <= local) ranks.resize(local + 1, -1);
    ranks[local] = r;
  }
  for (const std::vector<int>& ranks : g.rank_at) {
    if (ranks.empty() || std::count(ranks.begin(), ranks.end(), -1) > 0)
      in.fail("nodes whose local indices leave a gap");
    if (g.mode == DispatchMode::Hierarchical && ranks.size() != g.rank_at[0].size())
      in.fail("a hierarchical dispatcher with different numbers of EP ranks per node");
  }
  g.packets.assign(size_t(g.P) * size_t(g.P), 0);
  g.assignments.assign(g.packets.size(), 0);
  return g;
}

void read_slots(Reader& in, Group& g) {
  const int slots = in.next_in(g.P * g.slots_per_rank, g.P * g.slots_per_rank, "slot count");
  g.replicas.assign(size_t(g.experts), {});
  for (int s = 0; s < slots; ++s)
    g.replicas[size_t(in.next_in(0, g.experts - 1, "expert"))].push_back(s);
  for (const std::vector<int>& holders : g.replicas) {
    if (holders.empty()) in.fail("an expert without a slot");
  }
}

uint64_t bytes_of(const Group& g, int sender, int receiver, uint64_t per_packet,
                  uint64_t per_assignment) {
  const size_t at = size_t(sender * g.P + receiver);
  return uint64_t(g.packets[at]) * per_packet + uint64_t(g.assignments[at]) * per_assignment;
}

void add(ReplayedDispatch& out, const Group& g, int sender, int receiver, uint64_t bytes) {
  if (sender == receiver || bytes == 0) return;  // a copy, not a message
  (g.links_node[size_t(sender)] == g.links_node[size_t(receiver)] ? out.intra : out.inter) += bytes;
}

// Every flow of the last dispatch's plan, `per_packet` and `per_assignment` bytes each.
void add_flows(ReplayedDispatch& out, const Group& g, uint64_t per_packet,
               uint64_t per_assignment) {
  for (int s = 0; s < g.P; ++s) {
    for (int r = 0; r < g.P; ++r) add(out, g, s, r, bytes_of(g, s, r, per_packet, per_assignment));
  }
}

// One dispatch: its packets stage by stage (expert_dispatch.cpp's plan_first_stage and
// plan_second_stage), then the bytes of its own messages.
void read_dispatch(Reader& in, Group& g, ReplayedDispatch& out) {
  if (g.replicas.empty()) in.fail("a dispatch before the dispatcher's slots");
  const int N = in.next_in(0, kLargest, "tokens"), K = in.next_in(1, 1 << 16, "top-k");
  const int C = in.next_in(1, kLargest, "row width");
  std::fill(g.packets.begin(), g.packets.end(), 0);
  std::fill(g.assignments.begin(), g.assignments.end(), 0);
  g.row_bytes = uint64_t(C) * sizeof(float);
  g.planned = true;
  std::vector<int> turn(size_t(g.experts), 0), slots(static_cast<size_t>(K));
  const int my_node = g.node[size_t(g.me)], my_local = g.local[size_t(g.me)];
  for (int n = 0; n < N; ++n) {
    // The token's slots: a replicated expert's assignments in turn over its replicas, from a
    // rank-dependent one.
    for (int k = 0; k < K; ++k) {
      const int e = in.next_in(0, g.experts - 1, "expert");
      const std::vector<int>& holders = g.replicas[size_t(e)];
      slots[size_t(k)] = holders[size_t(turn[size_t(e)]++ + g.me) % holders.size()];
    }
    for (int k = 0; k < K; ++k) {
      const int owner = g.owner(slots[size_t(k)]);
      bool counted = false;
      for (int j = 0; j < k && g.mode != DispatchMode::Flat; ++j)
        counted |= g.owner(slots[size_t(j)]) == owner;
      if (owner != g.me && !counted) ++out.remote_rows;
    }
    // Where each slot's row goes first: its owner (flat modes) or the owner's node.
    auto first_hop = [&](int k) {
      const int owner = g.owner(slots[size_t(k)]);
      return g.mode == DispatchMode::Hierarchical ? g.node[size_t(owner)] : owner;
    };
    for (int k = 0; k < K; ++k) {
      const int d = first_hop(k);
      if (g.mode == DispatchMode::Flat) {
        g.flow(g.me, d, 1, 1);
        continue;
      }
      bool sent_before = false;
      for (int j = 0; j < k; ++j) sent_before |= first_hop(j) == d;
      if (sent_before) continue;
      std::vector<int> carried;  // the packet's slots, in top-k order
      for (int j = k; j < K; ++j) {
        if (first_hop(j) == d) carried.push_back(slots[size_t(j)]);
      }
      if (g.mode == DispatchMode::FlatDedup) {
        g.flow(g.me, d, 1, int64_t(carried.size()));
        continue;
      }
      // Hierarchical: to the rank of this rank's local index on node d, which splits the packet
      // by owner inside its node.
      const int forwarder = g.rank_at[size_t(d)][size_t(my_local)];
      g.flow(g.me, forwarder, 1, int64_t(carried.size()));
      for (size_t i = 0; i < carried.size(); ++i) {
        const int owner = g.owner(carried[i]);
        bool split_before = false;
        for (size_t j = 0; j < i; ++j) split_before |= g.owner(carried[j]) == owner;
        if (split_before) continue;
        const int64_t count = std::count_if(carried.begin() + ptrdiff_t(i), carried.end(),
                                            [&](int slot) { return g.owner(slot) == owner; });
        g.flow(forwarder, owner, 1, count);
      }
    }
  }
  out.dispatches += 1;
  out.tokens += N;
  out.assignments += int64_t(N) * K;
  // This rank's count messages: to every other peer of each stage.
  if (g.mode == DispatchMode::Hierarchical) {
    for (size_t d = 0; d < g.rank_at.size(); ++d) {
      if (int(d) != my_node) add(out, g, g.me, g.rank_at[d][size_t(my_local)], kCountBytes);
    }
    for (int peer : g.rank_at[size_t(my_node)]) add(out, g, g.me, peer, kCountBytes);
  } else {
    for (int peer = 0; peer < g.P; ++peer) add(out, g, g.me, peer, kCountBytes);
  }
  // Metadata, then the rows, along every flow.
  add_flows(out, g, kPacketMetaBytes + g.row_bytes, kAssignmentMetaBytes);
}

}  // namespace

ReplayedDispatch replay_dispatch_bytes(const std::vector<std::vector<int32_t>>& logs) {
  ReplayedDispatch out;
  for (size_t rank = 0; rank < logs.size(); ++rank) {
    Reader in(logs[rank], int(rank));
    std::vector<Group> groups;
    while (!in.done()) {
      const int32_t kind = in.next_in(int32_t(RoutingRecord::Dispatcher),
                                      int32_t(RoutingRecord::DispatchBackward), "record kind");
      const int32_t id = in.next();
      if (kind == int32_t(RoutingRecord::Dispatcher)) {
        if (id != int32_t(groups.size())) in.fail("dispatchers out of order");
        groups.push_back(read_dispatcher(in, int(logs.size())));
        continue;
      }
      if (id < 0 || id >= int32_t(groups.size())) in.fail("an unknown dispatcher");
      Group& g = groups[size_t(id)];
      switch (RoutingRecord(kind)) {
        case RoutingRecord::Slots:
          read_slots(in, g);
          break;
        case RoutingRecord::Dispatch:
          read_dispatch(in, g, out);
          break;
        default:
          if (!g.planned) in.fail("an operation before the dispatcher's first dispatch");
          if (kind == int32_t(RoutingRecord::CombineBackward)) {
            // dout rows along the dispatch route with each assignment's weight, then each
            // assignment's weight gradient back.
            add_flows(out, g, g.row_bytes, 2 * kScalarBytes);
          } else {
            // Combine and dispatch_backward: one row per assignment back along the route.
            add_flows(out, g, 0, g.row_bytes);
          }
      }
    }
  }
  return out;
}

}  // namespace rlf::sim
