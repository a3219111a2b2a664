// Expert-parallel dispatch/combine: routing plans (one or two exchange stages), the exchanges
// themselves (nonblocking point-to-point with exact counting and link emulation deadlines, run as
// split-phase chains of steps), and the slot-order reductions that make every mode agree with the
// single-rank MoE bit for bit.
#include "mpi_comm/expert_dispatch.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

#include "kernels/error.h"

namespace rlf {

namespace {

// Tags per stage: a stage's exchanges complete before the next starts, so distinct tags only
// guard against mistakes, never reorder anything. Each dispatcher has its own communicator, so
// operations of different dispatchers in flight at once never match each other's messages.
constexpr int kTagsPerStage = 8;
enum Tag { kCounts = 1, kMeta = 2, kRows = 3, kExtras = 4, kReverse = 5 };

// `count` empty lists that keep the capacity they had: a dispatcher plans one exchange after
// another of about the same shape.
void clear_lists(std::vector<std::vector<int>>& lists, size_t count) {
  lists.resize(count);
  for (std::vector<int>& list : lists) list.clear();
}

int checked_count(uint64_t bytes) {
  if (bytes > uint64_t(INT_MAX)) {
    throw std::length_error("ExpertDispatcher: a message of " + std::to_string(bytes) +
                            " bytes exceeds MPI's int count");
  }
  return int(bytes);
}

}  // namespace

const char* dispatch_mode_name(DispatchMode mode) {
  switch (mode) {
    case DispatchMode::Flat:
      return "flat";
    case DispatchMode::FlatDedup:
      return "flat-dedup";
    case DispatchMode::Hierarchical:
      return "hierarchical";
  }
  return "?";
}

DispatchMode parse_dispatch_mode(const std::string& name, const char* option) {
  for (DispatchMode mode :
       {DispatchMode::Flat, DispatchMode::FlatDedup, DispatchMode::Hierarchical}) {
    if (name == dispatch_mode_name(mode)) return mode;
  }
  throw ConfigError(std::string(option) + " must be flat, flat-dedup or hierarchical, got '" +
                    name + "'");
}

void validate_expert_parallel(int experts, int ep_size, int world_size) {
  if (experts < 1) throw ConfigError("--experts must be >= 1, got " + std::to_string(experts));
  if (ep_size < 1 || world_size % ep_size != 0) {
    throw ConfigError("--ep " + std::to_string(ep_size) + " does not divide the " +
                      std::to_string(world_size) + " ranks");
  }
  if (experts % ep_size != 0) {
    throw ConfigError("--ep " + std::to_string(ep_size) + " does not divide the " +
                      std::to_string(experts) + " experts (--experts)");
  }
}

void validate_redundant_slots(int redundant_slots, int experts, int ep_size, const char* option) {
  const int own = experts / std::max(ep_size, 1);
  if (redundant_slots < 0 || own + redundant_slots > experts) {
    throw ConfigError(std::string(option) + " must be in [0, " + std::to_string(experts - own) +
                      "] (a rank's " + std::to_string(own) +
                      " experts plus its redundant slots hold distinct experts of the " +
                      std::to_string(experts) + "), got " + std::to_string(redundant_slots));
  }
}

std::vector<int> default_slot_experts(int experts, int ep_size, int redundant_slots) {
  const int own = experts / ep_size, per_rank = own + redundant_slots;
  std::vector<int> slot_expert(size_t(per_rank) * size_t(ep_size));
  for (int r = 0; r < ep_size; ++r) {
    for (int i = 0; i < per_rank; ++i)
      slot_expert[size_t(r * per_rank + i)] = (r * own + i) % experts;
  }
  return slot_expert;
}

ExpertDispatcher::ExpertDispatcher(const HierarchicalComm& ep, Links& links, int experts,
                                   DispatchMode mode, double intra_node_bandwidth,
                                   int redundant_slots)
    : links_(links),
      world_ranks_(ep.world_ranks),
      experts_(experts),
      mode_(mode),
      intra_node_bandwidth_(intra_node_bandwidth) {
  // Every check uses only what every rank of the group knows alike, and runs before the first
  // collective, so all ranks throw the same error.
  validate_expert_parallel(experts, ep.size(), ep.size());
  validate_redundant_slots(redundant_slots, experts, ep.size(), "--redundant-experts");
  slots_per_rank_ = experts / ep.size() + redundant_slots;
  if (!(intra_node_bandwidth >= 0) || !std::isfinite(intra_node_bandwidth)) {
    throw ConfigError("--intra-node-bandwidth must be a finite number of bytes per second >= 0");
  }
  node_of_ = ep.leader_index_of;
  local_of_ = ep.local_rank_of;
  rank_at_.assign(size_t(ep.node_count()), {});
  // Local ranks follow comm order, so appending in comm order puts each at its local index.
  for (int r = 0; r < ep.size(); ++r) rank_at_[size_t(node_of_[size_t(r)])].push_back(r);
  if (mode == DispatchMode::Hierarchical) {
    for (const auto& node : rank_at_) {
      if (node.size() != rank_at_[0].size()) {
        throw ConfigError(
            "hierarchical expert dispatch needs the same number of EP ranks on every node "
            "(--ranks-per-node must divide the EP group evenly)");
      }
    }
  }
  MPI_Comm_dup(ep.comm, &comm_);
  MPI_Comm_rank(comm_, &rank_);
  if (RoutingLog* log = links_.routing_log()) {
    std::vector<int> links_node;
    for (int world : world_ranks_) links_node.push_back(links_.node_of(world));
    routing_id_ = log->add_dispatcher(int32_t(mode_), rank_, experts_, slots_per_rank_, links_node,
                                      node_of_, local_of_);
  }
  set_slot_experts(default_slot_experts(experts, ep.size(), redundant_slots));
}

ExpertDispatcher::~ExpertDispatcher() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

// One exchange: per peer of the stage, what to send and where to receive (bytes).
struct ExpertDispatcher::Transfer {
  std::vector<const void*> send;
  std::vector<uint64_t> send_bytes;
  std::vector<void*> recv;
  std::vector<uint64_t> recv_bytes;
  explicit Transfer(size_t peers)
      : send(peers, nullptr), send_bytes(peers, 0), recv(peers, nullptr), recv_bytes(peers, 0) {}
};

// Nonblocking receives and sends to every peer with a non-empty message. The receiver pays the
// emulated link time (so each message is delayed once) as a deadline: a rank's incoming
// messages pass one port one after another (Links::schedule_arrival), from the time the receive
// is posted. Messages to itself are copies, neither counted nor delayed.
void ExpertDispatcher::post(const Stage& stage, const Transfer& t, int tag, LinkCounters& kind) {
  const size_t Q = stage.peers.size();
  const double posted = steady_seconds();
  double deadline = posted;
  for (size_t q = 0; q < Q; ++q) {
    if (int(q) == stage.self) {
      if (t.send_bytes[q] != t.recv_bytes[q]) {
        throw std::logic_error("ExpertDispatcher: self message size mismatch");
      }
      if (t.send_bytes[q]) std::memcpy(t.recv[q], t.send[q], t.send_bytes[q]);
      continue;
    }
    if (t.recv_bytes[q] == 0) continue;
    MPI_Request request;
    MPI_Irecv(t.recv[q], checked_count(t.recv_bytes[q]), MPI_BYTE, stage.peers[q], tag, comm_,
              &request);
    chain_.add_request(request);
    const int world = world_ranks_[size_t(stage.peers[q])];
    double seconds = 0;
    if (links_.classify(links_.world_rank(), world) == LinkClass::InterNode) {
      seconds = links_.emulation().delay_seconds(t.recv_bytes[q]);
    } else if (intra_node_bandwidth_ > 0) {
      seconds = double(t.recv_bytes[q]) / intra_node_bandwidth_;
    }
    if (seconds > 0) deadline = std::max(deadline, links_.schedule_arrival(posted, seconds));
    traffic_.emulated_seconds += seconds;
  }
  for (size_t q = 0; q < Q; ++q) {
    if (int(q) == stage.self || t.send_bytes[q] == 0) continue;
    const int world = world_ranks_[size_t(stage.peers[q])];
    {
      const TrafficScope dispatch_traffic(links_, TrafficKind::ExpertDispatch);
      links_.count_send(world, t.send_bytes[q]);
    }
    kind.add(links_.classify(links_.world_rank(), world), t.send_bytes[q]);
    MPI_Request request;
    MPI_Isend(t.send[q], checked_count(t.send_bytes[q]), MPI_BYTE, stage.peers[q], tag, comm_,
              &request);
    chain_.add_request(request);
  }
  chain_.complete_no_earlier_than(deadline);
}

void ExpertDispatcher::post_bytes(const Stage& stage, int tag, bool payload) {
  Transfer t(stage.peers.size());
  for (size_t q = 0; q < stage.peers.size(); ++q) {
    t.send[q] = f_.send[q].data();
    t.send_bytes[q] = f_.send[q].size();
    t.recv[q] = f_.recv[q].data();
    t.recv_bytes[q] = f_.recv[q].size();
  }
  post(stage, t, tag, payload ? traffic_.payload : traffic_.metadata);
}

void ExpertDispatcher::log_operation(RoutingRecord kind) {
  if (routing_id_ >= 0) links_.routing_log()->operation(routing_id_, kind);
}

void ExpertDispatcher::check_idle() const {
  if (operation_ != Operation::None) {
    throw std::logic_error("ExpertDispatcher: an operation is still in flight (finish it first)");
  }
}

void ExpertDispatcher::begin(Operation operation, Steps steps) {
  check_idle();
  operation_ = operation;
  chain_.start(std::move(steps));
}

void ExpertDispatcher::finish(Operation operation) {
  if (operation_ != operation) {
    throw std::logic_error("ExpertDispatcher: finish_* does not match the operation begun");
  }
  progress_until_finished(chain_, {&chain_});
  operation_ = Operation::None;
}

// Counts (packets and assignments per peer), then metadata (per packet: origin, token,
// assignments, then (slot, expert) per assignment), parsed into the received assignments'
// identities.
void ExpertDispatcher::post_counts(int s) {
  Stage& stage = stages_[size_t(s)];
  const size_t Q = stage.peers.size();
  // The message buffers keep their capacity from operation to operation.
  f_.send.resize(Q);
  f_.recv.resize(Q);
  for (size_t q = 0; q < Q; ++q) {
    const int32_t counts[2] = {int32_t(stage.send_rows[q].size()),
                               int32_t(stage.send_handles[q].size())};
    f_.send[q].resize(sizeof counts);
    std::memcpy(f_.send[q].data(), counts, sizeof counts);
    f_.recv[q].resize(sizeof counts);
  }
  post_bytes(stage, s * kTagsPerStage + kCounts, false);
}

void ExpertDispatcher::read_counts_post_meta(int s) {
  Stage& stage = stages_[size_t(s)];
  const size_t Q = stage.peers.size();
  stage.recv_row_offset.assign(Q + 1, 0);
  stage.recv_assign_offset.assign(Q + 1, 0);
  for (size_t q = 0; q < Q; ++q) {
    int32_t counts[2];
    std::memcpy(counts, f_.recv[q].data(), sizeof counts);
    stage.recv_row_offset[q + 1] = stage.recv_row_offset[q] + counts[0];
    stage.recv_assign_offset[q + 1] = stage.recv_assign_offset[q] + counts[1];
  }
  for (size_t q = 0; q < Q; ++q) {
    const int64_t packets = stage.recv_row_offset[q + 1] - stage.recv_row_offset[q];
    const int64_t assigns = stage.recv_assign_offset[q + 1] - stage.recv_assign_offset[q];
    f_.send[q].resize(f_.meta[q].size() * sizeof(int));
    if (!f_.meta[q].empty()) std::memcpy(f_.send[q].data(), f_.meta[q].data(), f_.send[q].size());
    f_.recv[q].resize(size_t(3 * packets + 2 * assigns) * sizeof(int));  // received whole
  }
  post_bytes(stage, s * kTagsPerStage + kMeta, false);
}

void ExpertDispatcher::read_meta(int s) {
  Stage& stage = stages_[size_t(s)];
  const size_t Q = stage.peers.size();
  const int64_t total = stage.recv_assign_offset[Q];
  for (auto* v : {&stage.row_of_assign, &stage.origin, &stage.token, &stage.slot, &stage.expert})
    v->resize(size_t(total));
  int64_t at = 0;
  for (size_t q = 0; q < Q; ++q) {
    const uint8_t* bytes = f_.recv[q].data();
    const size_t values = f_.recv[q].size() / sizeof(int);
    size_t pos = 0;
    auto next = [&] {
      if (pos >= values)
        throw std::logic_error("ExpertDispatcher: metadata shorter than the exchanged counts");
      int value;
      std::memcpy(&value, bytes + pos++ * sizeof(int), sizeof value);
      return value;
    };
    for (int64_t p = stage.recv_row_offset[q]; p < stage.recv_row_offset[q + 1]; ++p) {
      const int origin = next(), token = next(), count = next();
      for (int a = 0; a < count; ++a, ++at) {
        if (at >= total)
          throw std::logic_error("ExpertDispatcher: metadata does not match the exchanged counts");
        const size_t i = size_t(at);
        stage.row_of_assign[i] = int(p);
        stage.origin[i] = origin;
        stage.token[i] = token;
        stage.slot[i] = next();
        stage.expert[i] = next();
      }
    }
  }
  if (at != total) {
    throw std::logic_error("ExpertDispatcher: metadata does not match the exchanged counts");
  }
}

void ExpertDispatcher::post_forward_rows(int s, const std::vector<float>& in, int width,
                                         const std::vector<float>* extras_by_handle,
                                         std::vector<float>& out, std::vector<float>* extras_out) {
  const Stage& stage = stages_[size_t(s)];
  const size_t Q = stage.peers.size();
  f_.packed.resize(Q);
  Transfer t(Q);
  out.resize(size_t(stage.recv_row_offset[Q]) * size_t(width));  // every row received
  for (size_t q = 0; q < Q; ++q) {
    f_.packed[q].resize(stage.send_rows[q].size() * size_t(width));
    for (size_t p = 0; p < stage.send_rows[q].size(); ++p) {
      std::memcpy(f_.packed[q].data() + p * size_t(width),
                  in.data() + size_t(stage.send_rows[q][p]) * size_t(width),
                  size_t(width) * sizeof(float));
    }
    t.send[q] = f_.packed[q].data();
    t.send_bytes[q] = f_.packed[q].size() * sizeof(float);
    t.recv[q] = out.data() + size_t(stage.recv_row_offset[q]) * size_t(width);
    t.recv_bytes[q] =
        uint64_t(stage.recv_row_offset[q + 1] - stage.recv_row_offset[q]) * uint64_t(width) * 4;
  }
  post(stage, t, s * kTagsPerStage + kRows, traffic_.payload);
  if (!extras_by_handle) return;
  Transfer e(Q);
  f_.packed_extras.resize(Q);
  extras_out->resize(size_t(stage.recv_assign_offset[Q]));
  for (size_t q = 0; q < Q; ++q) {
    f_.packed_extras[q].clear();
    for (int h : stage.send_handles[q])
      f_.packed_extras[q].push_back((*extras_by_handle)[size_t(h)]);
    e.send[q] = f_.packed_extras[q].data();
    e.send_bytes[q] = f_.packed_extras[q].size() * sizeof(float);
    e.recv[q] = extras_out->data() + stage.recv_assign_offset[q];
    e.recv_bytes[q] = uint64_t(stage.recv_assign_offset[q + 1] - stage.recv_assign_offset[q]) * 4;
  }
  post(stage, e, s * kTagsPerStage + kExtras, traffic_.metadata);
}

void ExpertDispatcher::post_reverse_rows(int s, int width, bool payload) {
  const Stage& stage = stages_[size_t(s)];
  const size_t Q = stage.peers.size();
  int64_t handles_sent = 0;
  for (size_t q = 0; q < Q; ++q) handles_sent += int64_t(stage.send_handles[q].size());
  f_.received.resize(size_t(handles_sent) * size_t(width));  // every handle's row comes back
  Transfer t(Q);
  // Received assignments of one peer are contiguous, so the reverse sends need no packing.
  for (size_t q = 0, offset = 0; q < Q; ++q) {
    t.send[q] = f_.by_assign.data() + size_t(stage.recv_assign_offset[q]) * size_t(width);
    t.send_bytes[q] =
        uint64_t(stage.recv_assign_offset[q + 1] - stage.recv_assign_offset[q]) * width * 4;
    t.recv[q] = f_.received.data() + offset * size_t(width);
    t.recv_bytes[q] = uint64_t(stage.send_handles[q].size()) * uint64_t(width) * 4;
    offset += stage.send_handles[q].size();
  }
  post(stage, t, s * kTagsPerStage + kReverse, payload ? traffic_.payload : traffic_.metadata);
}

void ExpertDispatcher::unpack_reverse_rows(int s, int width) {
  const Stage& stage = stages_[size_t(s)];
  const int64_t handles =
      s == 0 ? int64_t(N_) * K_ : int64_t(stages_[size_t(s) - 1].row_of_assign.size());
  // Every handle was sent to exactly one peer, so every row is written below.
  f_.by_handle.resize(size_t(handles) * size_t(width));
  for (size_t q = 0, offset = 0; q < stage.peers.size(); ++q) {
    for (size_t j = 0; j < stage.send_handles[q].size(); ++j, ++offset) {
      std::memcpy(f_.by_handle.data() + size_t(stage.send_handles[q][j]) * size_t(width),
                  f_.received.data() + offset * size_t(width), size_t(width) * sizeof(float));
    }
  }
  f_.by_assign.swap(f_.by_handle);
}

void ExpertDispatcher::add_gather_back(Steps& steps, std::function<const float*()> local_rows,
                                       int width, bool payload, std::function<void()> then) {
  const int last = int(stages_.size()) - 1;
  steps.push_back([this, local_rows, width, payload, last] {
    const Stage& stage = stages_.back();
    const float* rows = local_rows();
    f_.by_assign.resize(stage.row_of_assign.size() * size_t(width));
    for (size_t i = 0; i < stage.row_of_assign.size(); ++i) {
      std::memcpy(f_.by_assign.data() + i * size_t(width),
                  rows + size_t(canonical_of_assign_[i]) * size_t(width),
                  size_t(width) * sizeof(float));
    }
    post_reverse_rows(last, width, payload);
  });
  for (int s = last; s >= 0; --s) {
    steps.push_back([this, s, width, payload, then] {
      unpack_reverse_rows(s, width);
      if (s > 0) {
        post_reverse_rows(s - 1, width, payload);
      } else {
        then();
      }
    });
  }
}

// Stage 0: from the token's rank to the owner (flat) or to the same local index on the owner's
// node (hierarchical).
void ExpertDispatcher::plan_first_stage(const int* expert_idx) {
  const int N = N_, K = K_, P = ep_size();
  const bool hierarchical = mode_ == DispatchMode::Hierarchical;
  const int my_node = node_of_[size_t(rank_)], my_local = local_of_[size_t(rank_)];
  Stage& first = stages_[0];
  if (hierarchical) {
    for (const auto& node : rank_at_) first.peers.push_back(node[size_t(my_local)]);
    first.self = my_node;
  } else {
    first.peers.resize(size_t(P));
    std::iota(first.peers.begin(), first.peers.end(), 0);
    first.self = rank_;
  }
  // `dest` maps an expert to the index of its peer in this stage.
  auto dest = [&](int e) { return hierarchical ? node_of_[size_t(owner_of(e))] : owner_of(e); };
  const size_t Q0 = first.peers.size();
  clear_lists(first.send_rows, Q0);
  clear_lists(first.send_handles, Q0);
  clear_lists(f_.meta, Q0);
  for (int n = 0; n < N; ++n) {
    const int* slots = expert_idx + int64_t(n) * K;
    for (int k = 0; k < K; ++k) {
      const int d = dest(slots[k]);
      bool sent_before = false;
      for (int j = 0; j < k && mode_ != DispatchMode::Flat; ++j) sent_before |= dest(slots[j]) == d;
      if (sent_before) continue;
      // One packet for this (token, destination): this slot, plus later slots going the same
      // way unless every slot travels alone (Flat).
      auto& m = f_.meta[size_t(d)];
      m.insert(m.end(), {rank_, n, 0});
      const size_t count_at = m.size() - 1;
      first.send_rows[size_t(d)].push_back(n);
      for (int j = k; j < (mode_ == DispatchMode::Flat ? k + 1 : K); ++j) {
        if (dest(slots[j]) != d) continue;
        m.insert(m.end(), {j, slots[j]});
        first.send_handles[size_t(d)].push_back(n * K + j);
        ++m[count_at];
      }
    }
  }
}

// Stage 1 (hierarchical): inside the node, each packet received in stage 0 is split by owner;
// handles are the received assignments of stage 0.
void ExpertDispatcher::plan_second_stage() {
  const Stage& first = stages_[0];
  Stage& second = stages_[1];
  const int my_node = node_of_[size_t(rank_)];
  second.peers = rank_at_[size_t(my_node)];
  second.self = local_of_[size_t(rank_)];
  const size_t Q1 = second.peers.size();
  clear_lists(second.send_rows, Q1);
  clear_lists(second.send_handles, Q1);
  clear_lists(f_.meta, Q1);
  const int64_t assigns = int64_t(first.row_of_assign.size());
  for (int64_t begin = 0, end = 0; begin < assigns; begin = end) {
    end = begin;
    while (end < assigns && first.row_of_assign[size_t(end)] == first.row_of_assign[size_t(begin)])
      ++end;
    for (int64_t i = begin; i < end; ++i) {
      const int d = local_of_[size_t(owner_of(first.expert[size_t(i)]))];
      bool sent_before = false;
      for (int64_t j = begin; j < i; ++j) {
        sent_before |= local_of_[size_t(owner_of(first.expert[size_t(j)]))] == d;
      }
      if (sent_before) continue;
      auto& m = f_.meta[size_t(d)];
      m.insert(m.end(), {first.origin[size_t(i)], first.token[size_t(i)], 0});
      const size_t count_at = m.size() - 1;
      second.send_rows[size_t(d)].push_back(first.row_of_assign[size_t(i)]);
      for (int64_t j = i; j < end; ++j) {
        if (local_of_[size_t(owner_of(first.expert[size_t(j)]))] != d) continue;
        m.insert(m.end(), {first.slot[size_t(j)], first.expert[size_t(j)]});
        second.send_handles[size_t(d)].push_back(int(j));
        ++m[count_at];
      }
    }
  }
}

// Canonical order: by (expert, origin rank, token, slot); f_.rows holds the last stage's rows.
void ExpertDispatcher::order_canonically() {
  const Stage& last = stages_.back();
  const size_t M = last.row_of_assign.size();
  const int C = C_;
  const int first_slot = rank_ * local_experts();
  // A counting sort by local slot (stable: the received order inside a slot), then each slot's
  // run in (origin, token, top-k slot) order. The runs arrive in that order whenever every
  // sender packs in token order and the peers are the origins in rank order (the flat modes),
  // so the check finds nothing to sort there; a hierarchical stage interleaves the origins.
  local_offsets_.assign(size_t(local_experts()) + 1, 0);
  for (size_t i = 0; i < M; ++i) ++local_offsets_[size_t(last.expert[i] - first_slot) + 1];
  for (int e = 0; e < local_experts(); ++e)
    local_offsets_[size_t(e) + 1] += local_offsets_[size_t(e)];
  order_.resize(M);
  next_in_slot_.assign(local_offsets_.begin(), local_offsets_.end() - 1);
  for (size_t i = 0; i < M; ++i)
    order_[size_t(next_in_slot_[size_t(last.expert[i] - first_slot)]++)] = int(i);
  auto before = [&](int a, int b) {
    const size_t i = size_t(a), j = size_t(b);
    if (last.origin[i] != last.origin[j]) return last.origin[i] < last.origin[j];
    if (last.token[i] != last.token[j]) return last.token[i] < last.token[j];
    return last.slot[i] < last.slot[j];
  };
  for (int e = 0; e < local_experts(); ++e) {
    const auto first = order_.begin() + local_offsets_[size_t(e)];
    const auto end = order_.begin() + local_offsets_[size_t(e) + 1];
    if (!std::is_sorted(first, end, before)) std::sort(first, end, before);
  }
  canonical_of_assign_.resize(M);
  f_.result.resize(M * size_t(C));
  for (size_t m = 0; m < M; ++m) {
    const size_t i = size_t(order_[m]);
    canonical_of_assign_[i] = int(m);
    std::memcpy(f_.result.data() + m * size_t(C),
                f_.rows.data() + size_t(last.row_of_assign[i]) * size_t(C),
                size_t(C) * sizeof(float));
  }
}

void ExpertDispatcher::set_expert_slots(const std::vector<int>& slot_of) {
  std::vector<int> sorted = slot_of;
  std::sort(sorted.begin(), sorted.end());
  for (int e = 0; e < experts_; ++e) {
    if (sorted.size() != size_t(experts_) || sorted[size_t(e)] != e || slots() != experts_) {
      throw std::invalid_argument("ExpertDispatcher::set_expert_slots: not a permutation of the " +
                                  std::to_string(experts_) + " experts' slots");
    }
  }
  std::vector<int> slot_expert(static_cast<size_t>(experts_));
  for (int e = 0; e < experts_; ++e) slot_expert[size_t(slot_of[size_t(e)])] = e;
  set_slot_experts(std::move(slot_expert));
}

void ExpertDispatcher::set_slot_experts(std::vector<int> slot_expert) {
  check_idle();
  if (slot_expert.size() != size_t(slots())) {
    throw std::invalid_argument(
        "ExpertDispatcher::set_slot_experts: " + std::to_string(slot_expert.size()) +
        " entries for " + std::to_string(slots()) + " slots");
  }
  std::vector<std::vector<int>> replicas(static_cast<size_t>(experts_));
  for (int s = 0; s < slots(); ++s) {
    const int e = slot_expert[size_t(s)];
    if (e < 0 || e >= experts_) {
      throw std::invalid_argument("ExpertDispatcher::set_slot_experts: expert " +
                                  std::to_string(e) + " outside [0, " + std::to_string(experts_) +
                                  ")");
    }
    std::vector<int>& holders = replicas[size_t(e)];
    if (!holders.empty() && owner_of(holders.back()) == owner_of(s)) {
      throw std::invalid_argument("ExpertDispatcher::set_slot_experts: expert " +
                                  std::to_string(e) + " twice on EP rank " +
                                  std::to_string(owner_of(s)));
    }
    holders.push_back(s);
  }
  for (int e = 0; e < experts_; ++e) {
    if (replicas[size_t(e)].empty()) {
      throw std::invalid_argument("ExpertDispatcher::set_slot_experts: expert " +
                                  std::to_string(e) + " has no slot");
    }
  }
  slot_expert_ = std::move(slot_expert);
  replicas_ = std::move(replicas);
  if (routing_id_ >= 0) links_.routing_log()->slots(routing_id_, slot_expert_);
}

std::vector<int64_t> ExpertDispatcher::take_expert_tokens() {
  std::vector<int64_t> taken(size_t(experts_), 0);
  taken.swap(expert_tokens_);
  taken.resize(size_t(experts_), 0);
  return taken;
}

void ExpertDispatcher::begin_dispatch(const float* x, const int* expert_idx, int N, int K, int C) {
  check_idle();
  for (int64_t i = 0; i < int64_t(N) * K; ++i) {
    if (expert_idx[i] < 0 || expert_idx[i] >= experts_) {
      throw std::out_of_range("ExpertDispatcher::dispatch: expert index " +
                              std::to_string(expert_idx[i]) + " outside [0, " +
                              std::to_string(experts_) + ")");
    }
  }
  if (routing_id_ >= 0) links_.routing_log()->dispatch(routing_id_, N, K, C, expert_idx);
  expert_tokens_.resize(size_t(experts_), 0);
  for (int64_t i = 0; i < int64_t(N) * K; ++i) ++expert_tokens_[size_t(expert_idx[i])];
  N_ = N;
  K_ = K;
  C_ = C;
  local_offsets_.clear();
  stages_.resize(mode_ == DispatchMode::Hierarchical ? 2 : 1);
  for (Stage& stage : stages_) stage.peers.clear();  // the rest is sized as it is planned
  // Every assignment to its expert's slot; a replicated expert's assignments in turn over its
  // replicas, starting at a rank-dependent one so every replica gets a share of few tokens too.
  slot_indices_.resize(size_t(N) * size_t(K));
  std::vector<int> seen(static_cast<size_t>(experts_), 0);
  for (size_t i = 0; i < slot_indices_.size(); ++i) {
    const std::vector<int>& holders = replicas_[size_t(expert_idx[i])];
    int& turn = seen[size_t(expert_idx[i])];
    slot_indices_[i] = holders[size_t(turn++ + rank_) % holders.size()];
  }
  plan_first_stage(slot_indices_.data());
  f_.rows.assign(x, x + int64_t(N) * C);
  Steps steps;
  for (int s = 0; s < int(stages_.size()); ++s) {
    steps.push_back([this, s] {
      if (s > 0) {
        f_.rows.swap(f_.next_rows);
        plan_second_stage();
      }
      post_counts(s);
    });
    steps.push_back([this, s] { read_counts_post_meta(s); });
    steps.push_back([this, s] {
      read_meta(s);
      post_forward_rows(s, f_.rows, C_, nullptr, f_.next_rows, nullptr);
    });
  }
  steps.push_back([this] {
    f_.rows.swap(f_.next_rows);
    order_canonically();
  });
  begin(Operation::Dispatch, std::move(steps));
}

std::vector<float> ExpertDispatcher::finish_dispatch() {
  finish(Operation::Dispatch);
  traffic_.expert_rows += local_rows();
  return std::move(f_.result);
}

void ExpertDispatcher::begin_combine(const float* y_local, const float* expert_weight) {
  check_idle();
  log_operation(RoutingRecord::Combine);
  f_.weights.assign(expert_weight, expert_weight + int64_t(N_) * K_);
  Steps steps;
  add_gather_back(
      steps, [y_local] { return y_local; }, C_, true,
      [this] {
        // The arithmetic of ref::moe_combine, with y(n, k) at row n K + k: each output
        // element sums its K terms in slot order from 0, here a row at a time (vectorized).
        const int64_t N = N_, K = K_, C = C_;
        const std::vector<float>& y = f_.by_assign;
        f_.result.assign(size_t(N * C), 0.0f);
        for (int64_t n = 0; n < N; ++n) {
          float* out = f_.result.data() + n * C;
          for (int64_t k = 0; k < K; ++k) {
            const float w = f_.weights[size_t(n * K + k)];
            const float* yk = y.data() + (n * K + k) * C;
            for (int64_t c = 0; c < C; ++c) out[c] += w * yk[c];
          }
        }
      });
  begin(Operation::Combine, std::move(steps));
}

std::vector<float> ExpertDispatcher::finish_combine() {
  finish(Operation::Combine);
  return std::move(f_.result);
}

void ExpertDispatcher::begin_dispatch_backward(const float* dxg_local) {
  check_idle();
  log_operation(RoutingRecord::DispatchBackward);
  Steps steps;
  add_gather_back(
      steps, [dxg_local] { return dxg_local; }, C_, true,
      [this] {
        // The arithmetic of ref::moe_gather_backward into a zeroed dx: each element sums its
        // K terms in slot order from 0, a row at a time (vectorized).
        const int64_t N = N_, K = K_, C = C_;
        const std::vector<float>& dxg = f_.by_assign;
        f_.result.assign(size_t(N * C), 0.0f);
        for (int64_t n = 0; n < N; ++n) {
          float* dx = f_.result.data() + n * C;
          for (int64_t k = 0; k < K; ++k) {
            const float* row = dxg.data() + (n * K + k) * C;
            for (int64_t c = 0; c < C; ++c) dx[c] += row[c];
          }
        }
      });
  begin(Operation::DispatchBackward, std::move(steps));
}

std::vector<float> ExpertDispatcher::finish_dispatch_backward() {
  finish(Operation::DispatchBackward);
  return std::move(f_.result);
}

void ExpertDispatcher::begin_combine_backward(const float* dout, const float* y_local,
                                              const float* expert_weight) {
  check_idle();
  log_operation(RoutingRecord::CombineBackward);
  // dout rows travel the dispatch route (de-duplicated), each assignment's weight with them.
  f_.rows.assign(dout, dout + int64_t(N_) * C_);
  f_.weights.assign(expert_weight, expert_weight + int64_t(N_) * K_);
  f_.y_local = y_local;
  Steps steps;
  for (int s = 0; s < int(stages_.size()); ++s) {
    steps.push_back([this, s] {
      if (s > 0) {
        f_.rows.swap(f_.next_rows);
        f_.weights.swap(f_.next_weights);
      }
      post_forward_rows(s, f_.rows, C_, &f_.weights, f_.next_rows, &f_.next_weights);
    });
  }
  steps.push_back([this] {
    f_.rows.swap(f_.next_rows);
    f_.weights.swap(f_.next_weights);
    // The arithmetic of ref::moe_combine_backward into zeroed dy and dexpert_weight.
    const Stage& last = stages_.back();
    const int64_t C = C_;
    f_.dy.assign(size_t(local_rows()) * size_t(C), 0.0f);
    f_.dweight_local.assign(size_t(local_rows()), 0.0f);
    for (size_t i = 0; i < last.row_of_assign.size(); ++i) {
      const int64_t m = canonical_of_assign_[i];
      const float* d = f_.rows.data() + int64_t(last.row_of_assign[i]) * C;
      const float w = f_.weights[i];
      float dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        f_.dy[size_t(m * C + c)] += w * d[c];
        dot += d[c] * f_.y_local[m * C + c];
      }
      f_.dweight_local[size_t(m)] = 0.0f + dot;
    }
  });
  add_gather_back(
      steps, [this] { return f_.dweight_local.data(); }, 1, false, [] {});
  begin(Operation::CombineBackward, std::move(steps));
}

void ExpertDispatcher::finish_combine_backward(std::vector<float>& dy_local,
                                               std::vector<float>& dexpert_weight) {
  finish(Operation::CombineBackward);
  dy_local = std::move(f_.dy);
  dexpert_weight = std::move(f_.by_assign);
}

std::vector<float> ExpertDispatcher::dispatch(const float* x, const int* expert_idx, int N, int K,
                                              int C) {
  begin_dispatch(x, expert_idx, N, K, C);
  return finish_dispatch();
}

std::vector<float> ExpertDispatcher::combine(const float* y_local, const float* expert_weight) {
  begin_combine(y_local, expert_weight);
  return finish_combine();
}

void ExpertDispatcher::combine_backward(const float* dout, const float* y_local,
                                        const float* expert_weight, std::vector<float>& dy_local,
                                        std::vector<float>& dexpert_weight) {
  begin_combine_backward(dout, y_local, expert_weight);
  finish_combine_backward(dy_local, dexpert_weight);
}

std::vector<float> ExpertDispatcher::dispatch_backward(const float* dxg_local) {
  begin_dispatch_backward(dxg_local);
  return finish_dispatch_backward();
}

}  // namespace rlf
