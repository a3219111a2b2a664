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
  std::vector<int> turn(size_t(g.experts), 0), slots(static_cast<size_t>(K)), carried;
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
      carried.clear();  // the packet's slots, in top-k order
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

// One copy_experts_into_slots as this rank logged it: the bytes it received (every rank logs its
// own call, so each copy is counted once, by its target).
void read_slot_copies(Reader& in, int world_size, ReplayedDispatch& out) {
  const int P = in.next_in(1, world_size, "EP size"), me = in.next_in(0, P - 1, "EP rank");
  const int32_t values_left = int32_t(std::min<size_t>(in.remaining(), kLargest));
  const int L = in.next_in(1, values_left / P, "local slots");
  const int experts = in.next_in(1, P * L, "experts");
  const int buffers = in.next_in(1, 64, "buffers");
  const int layers = in.next_in(0, values_left, "layers");
  std::vector<int> links_node;
  for (int r = 0; r < P; ++r) links_node.push_back(in.next_in(0, kLargest, "links node"));
  const size_t S = size_t(P) * size_t(L);
  std::vector<int> old_table(S), new_table(S);
  std::vector<int64_t> floats(static_cast<size_t>(L));
  for (int l = 0; l < layers; ++l) {
    for (int& e : old_table) e = in.next_in(-1, experts - 1, "expert");
    for (int& e : new_table) e = in.next_in(0, experts - 1, "expert");
    for (int64_t& f : floats) f = in.next_in(0, kLargest, "slot floats");
    if (floats[0] == 0) continue;  // a layer this rank does not store (another stage's)
    std::vector<std::vector<int>> holders(static_cast<size_t>(experts));
    for (size_t s = 0; s < S; ++s)
      if (old_table[s] >= 0) holders[size_t(old_table[s])].push_back(int(s));
    for (int s = me * L; s < (me + 1) * L; ++s) {
      const int expert = new_table[size_t(s)];
      if (expert == old_table[size_t(s)]) continue;
      const std::vector<int>& from = holders[size_t(expert)];
      if (from.empty()) in.fail("expert " + std::to_string(expert) + " had no slot to copy from");
      int source = from[size_t(s) % from.size()];
      for (int h : from)
        if (h / L == me) source = h;  // a copy on this rank: no message
      if (source / L == me) continue;
      const uint64_t bytes = uint64_t(floats[size_t(s % L)]) * uint64_t(buffers) * sizeof(float);
      (links_node[size_t(source / L)] == links_node[size_t(me)] ? out.migration_intra
                                                                : out.migration_inter) += bytes;
    }
  }
}

// One sum_replica_gradients as this rank logged it: what it sent, its slice of every replicated
// expert it holds to each other holder.
void read_replica_sums(Reader& in, int world_size, ReplayedDispatch& out) {
  const int P = in.next_in(1, world_size, "EP size"), me = in.next_in(0, P - 1, "EP rank");
  const int32_t values_left = int32_t(std::min<size_t>(in.remaining(), kLargest));
  const int L = in.next_in(1, values_left / P, "local slots");
  const int experts = in.next_in(1, P * L, "experts");
  const int layers = in.next_in(0, values_left, "layers");
  std::vector<int> links_node;
  for (int r = 0; r < P; ++r) links_node.push_back(in.next_in(0, kLargest, "links node"));
  std::vector<int> table(size_t(P) * size_t(L));
  std::vector<int64_t> floats(static_cast<size_t>(L));
  for (int l = 0; l < layers; ++l) {
    for (int& e : table) e = in.next_in(0, experts - 1, "expert");
    for (int64_t& f : floats) f = in.next_in(0, kLargest, "slot floats");
    std::vector<std::vector<int>> holders(static_cast<size_t>(experts));
    for (size_t s = 0; s < table.size(); ++s) holders[size_t(table[s])].push_back(int(s));
    for (const std::vector<int>& slots : holders) {
      if (slots.size() < 2) continue;
      for (int mine : slots) {
        if (mine / L != me) continue;
        const uint64_t bytes = uint64_t(floats[size_t(mine % L)]) * sizeof(float);
        for (int other : slots) {
          if (other == mine || bytes == 0) continue;
          (links_node[size_t(other / L)] == links_node[size_t(me)] ? out.replica_sums_intra
                                                                   : out.replica_sums_inter) +=
              bytes;
        }
      }
    }
  }
}

// One switch to the generation EP layout as this rank logged it: what it received.
void read_expert_switch(Reader& in, int world_size, ReplayedDispatch& out) {
  const int T = in.next_in(1, world_size, "training EP degree"),
            me = in.next_in(0, T - 1, "EP rank");
  const int32_t values_left = int32_t(std::min<size_t>(in.remaining(), kLargest));
  const int L = in.next_in(1, values_left / T, "local slots");
  const int experts = in.next_in(1, T * L, "experts");
  const int layers = in.next_in(0, values_left, "layers");
  const uint64_t expert_bytes = uint64_t(in.next_in(0, kLargest, "expert floats")) * sizeof(float);
  const int wanted = in.next_in(0, experts, "generation slots");
  std::vector<int> links_node;
  for (int r = 0; r < T; ++r) links_node.push_back(in.next_in(0, kLargest, "links node"));
  std::vector<int> table(size_t(T) * size_t(L));
  for (int l = 0; l < layers; ++l) {
    for (int& e : table) e = in.next_in(0, experts - 1, "expert");
    std::vector<std::vector<int>> holders(static_cast<size_t>(experts));
    for (size_t s = 0; s < table.size(); ++s) holders[size_t(table[s])].push_back(int(s));
    for (int w = 0; w < wanted; ++w) {
      const std::vector<int>& slots = holders[size_t(in.next_in(0, experts - 1, "expert"))];
      if (slots.empty()) in.fail("a generation expert without a training slot");
      int source = slots.front();
      for (int slot : slots)
        if (slot / L == me) source = slot;
      if (source / L == me) continue;  // its own copy: no message
      (links_node[size_t(source / L)] == links_node[size_t(me)] ? out.switch_intra
                                                                : out.switch_inter) += expert_bytes;
    }
  }
}

// One EP learner's weight sync as it logged it: what it sent.
void read_expert_sync(Reader& in, ReplayedDispatch& out) {
  const int32_t values_left = int32_t(std::min<size_t>(in.remaining(), kLargest));
  const int ep_rank = in.next_in(0, values_left, "EP rank");
  const int local = in.next_in(1, values_left, "slots per learner");
  const int experts = in.next_in(1, values_left, "experts");
  const int actor_ep = in.next_in(1, experts, "actor EP degree");
  const int actor_tp = in.next_in(1, values_left, "actor TP degree");
  const int layers = in.next_in(0, values_left / experts, "layers");
  const uint64_t expert_bytes = uint64_t(in.next_in(0, kLargest, "expert floats")) * sizeof(float);
  const bool sends_tables = in.next_in(0, 1, "tables flag") == 1;
  const int actors = in.next_in(0, values_left, "actors");
  const int node = in.next_in(0, kLargest, "links node");
  std::vector<int> actor_node;
  for (int a = 0; a < actors; ++a) actor_node.push_back(in.next_in(0, kLargest, "links node"));
  std::vector<int> slot_of(size_t(layers) * size_t(experts));
  for (int& slot : slot_of) slot = in.next_in(0, kLargest, "slot");
  const int per_actor = experts / actor_ep;
  for (int a = 0; a < actors; ++a) {
    uint64_t bytes = sends_tables ? slot_of.size() * sizeof(int32_t) : 0;
    const int first = (a / actor_tp) % actor_ep * per_actor;  // expert_shard_of
    for (int l = 0; l < layers; ++l)
      for (int e = first; e < first + per_actor; ++e)
        if (slot_of[size_t(l) * size_t(experts) + size_t(e)] / local == ep_rank)
          bytes += expert_bytes;
    (actor_node[size_t(a)] == node ? out.sync_intra : out.sync_inter) += bytes;
  }
}

void read_placement(RoutingRecord kind, Reader& in, int world_size, ReplayedDispatch& out) {
  switch (kind) {
    case RoutingRecord::SlotCopies:
      return read_slot_copies(in, world_size, out);
    case RoutingRecord::ReplicaSums:
      return read_replica_sums(in, world_size, out);
    case RoutingRecord::ExpertSwitch:
      return read_expert_switch(in, world_size, out);
    case RoutingRecord::ExpertSync:
      return read_expert_sync(in, out);
    default:
      in.fail("record kind " + std::to_string(int(kind)) + " is not a placement's");
  }
}

}  // namespace

ReplayedDispatch replay_dispatch_bytes(const std::vector<std::vector<int32_t>>& logs) {
  ReplayedDispatch out;
  for (size_t rank = 0; rank < logs.size(); ++rank) {
    Reader in(logs[rank], int(rank));
    std::vector<Group> groups;
    // A log of the first format (no Format record) did not log the slot copies.
    if (!logs[rank].empty() && logs[rank][0] != int32_t(RoutingRecord::Format))
      out.placement_logged = false;
    while (!in.done()) {
      const int32_t kind = in.next_in(int32_t(RoutingRecord::Dispatcher),
                                      int32_t(RoutingRecord::ExpertSync), "record kind");
      const int32_t id = in.next();
      if (kind == int32_t(RoutingRecord::Format)) {
        if (id != RoutingLog::kFormat) in.fail("format " + std::to_string(id) + " unknown");
        continue;
      }
      if (kind >= int32_t(RoutingRecord::SlotCopies) && kind != int32_t(RoutingRecord::Format)) {
        // What follows the placement: no dispatcher of its own.
        if (id != -1) in.fail("a placement record names dispatcher " + std::to_string(id));
        read_placement(RoutingRecord(kind), in, int(logs.size()), out);
        continue;
      }
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
