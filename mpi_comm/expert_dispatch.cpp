// Expert-parallel dispatch/combine: routing plans (one or two exchange stages), the exchanges
// themselves (nonblocking point-to-point with exact counting and link emulation), and the
// slot-order reductions that make every mode agree with the single-rank MoE bit for bit.
#include "mpi_comm/expert_dispatch.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>

#include "kernels/error.h"

namespace rlf {

namespace {

// Tags per stage: a stage's exchanges complete before the next starts, so distinct tags only
// guard against mistakes, never reorder anything.
constexpr int kTagsPerStage = 8;
enum Tag { kCounts = 1, kMeta = 2, kRows = 3, kExtras = 4, kReverse = 5 };

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

ExpertDispatcher::ExpertDispatcher(const HierarchicalComm& ep, Links& links, int experts,
                                   DispatchMode mode, double intra_node_bandwidth)
    : links_(links),
      world_ranks_(ep.world_ranks),
      experts_(experts),
      mode_(mode),
      intra_node_bandwidth_(intra_node_bandwidth) {
  // Every check uses only what every rank of the group knows alike, and runs before the first
  // collective, so all ranks throw the same error.
  validate_expert_parallel(experts, ep.size(), ep.size());
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
}

ExpertDispatcher::~ExpertDispatcher() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

namespace {

// Nonblocking sends and receives to every peer with a non-empty message, waits without
// spinning, then pays the emulated link time of each received message (the receiver pays, so
// each message is delayed once; a rank's incoming messages are delayed one after another, as
// through one network port). Messages to itself are copies, neither counted nor delayed.
struct Transfer {
  std::vector<const void*> send;
  std::vector<uint64_t> send_bytes;
  std::vector<void*> recv;
  std::vector<uint64_t> recv_bytes;
  explicit Transfer(size_t peers)
      : send(peers, nullptr), send_bytes(peers, 0), recv(peers, nullptr), recv_bytes(peers, 0) {}
};

void run_transfer(const ExpertDispatcher::Stage& stage, const Transfer& t, int tag, MPI_Comm comm,
                  Links& links, const std::vector<int>& world_ranks, double intra_node_bandwidth,
                  LinkCounters& kind, double& emulated) {
  const size_t Q = stage.peers.size();
  std::vector<MPI_Request> requests;
  std::vector<size_t> received_from;
  for (size_t q = 0; q < Q; ++q) {
    if (int(q) == stage.self) {
      if (t.send_bytes[q] != t.recv_bytes[q]) {
        throw std::logic_error("ExpertDispatcher: self message size mismatch");
      }
      if (t.send_bytes[q]) std::memcpy(t.recv[q], t.send[q], t.send_bytes[q]);
      continue;
    }
    if (t.recv_bytes[q] == 0) continue;
    requests.emplace_back();
    MPI_Irecv(t.recv[q], checked_count(t.recv_bytes[q]), MPI_BYTE, stage.peers[q], tag, comm,
              &requests.back());
    received_from.push_back(q);
  }
  const size_t receives = requests.size();
  for (size_t q = 0; q < Q; ++q) {
    if (int(q) == stage.self || t.send_bytes[q] == 0) continue;
    const int world = world_ranks[size_t(stage.peers[q])];
    links.count_send(world, t.send_bytes[q]);
    kind.add(links.classify(links.world_rank(), world), t.send_bytes[q]);
    requests.emplace_back();
    MPI_Isend(t.send[q], checked_count(t.send_bytes[q]), MPI_BYTE, stage.peers[q], tag, comm,
              &requests.back());
  }
  for (MPI_Request& request : requests) wait_with_backoff(&request, MPI_STATUS_IGNORE);
  for (size_t i = 0; i < receives; ++i) {
    const size_t q = received_from[i];
    const uint64_t bytes = t.recv_bytes[q];
    const int world = world_ranks[size_t(stage.peers[q])];
    double seconds = 0;
    if (links.classify(links.world_rank(), world) == LinkClass::InterNode) {
      seconds = links.emulation().delay_seconds(bytes);
    } else if (intra_node_bandwidth > 0) {
      seconds = double(bytes) / intra_node_bandwidth;
    }
    if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    emulated += seconds;
  }
}

}  // namespace

void ExpertDispatcher::exchange(const Stage& stage, int tag,
                                const std::vector<std::vector<uint8_t>>& send,
                                std::vector<std::vector<uint8_t>>& recv, bool payload) {
  Transfer t(stage.peers.size());
  for (size_t q = 0; q < stage.peers.size(); ++q) {
    t.send[q] = send[q].data();
    t.send_bytes[q] = send[q].size();
    t.recv[q] = recv[q].data();
    t.recv_bytes[q] = recv[q].size();
  }
  run_transfer(stage, t, tag, comm_, links_, world_ranks_, intra_node_bandwidth_,
               payload ? traffic_.payload : traffic_.metadata, traffic_.emulated_seconds);
}

// Counts, then metadata (per packet: origin, token, assignments, then (slot, expert) per
// assignment), parsed into the received assignments' identities.
void ExpertDispatcher::build_stage(Stage& stage, int tag,
                                   const std::vector<std::vector<int>>& send_meta) {
  const size_t Q = stage.peers.size();
  std::vector<std::vector<uint8_t>> send(Q), recv(Q);
  for (size_t q = 0; q < Q; ++q) {
    const int32_t counts[2] = {int32_t(stage.send_rows[q].size()),
                               int32_t(stage.send_handles[q].size())};
    send[q].resize(sizeof counts);
    std::memcpy(send[q].data(), counts, sizeof counts);
    recv[q].resize(sizeof counts);
  }
  exchange(stage, tag + kCounts, send, recv, false);
  stage.recv_row_offset.assign(Q + 1, 0);
  stage.recv_assign_offset.assign(Q + 1, 0);
  for (size_t q = 0; q < Q; ++q) {
    int32_t counts[2];
    std::memcpy(counts, recv[q].data(), sizeof counts);
    stage.recv_row_offset[q + 1] = stage.recv_row_offset[q] + counts[0];
    stage.recv_assign_offset[q + 1] = stage.recv_assign_offset[q] + counts[1];
  }
  for (size_t q = 0; q < Q; ++q) {
    const int64_t packets = stage.recv_row_offset[q + 1] - stage.recv_row_offset[q];
    const int64_t assigns = stage.recv_assign_offset[q + 1] - stage.recv_assign_offset[q];
    send[q].resize(send_meta[q].size() * sizeof(int));
    if (!send_meta[q].empty()) std::memcpy(send[q].data(), send_meta[q].data(), send[q].size());
    recv[q].assign(size_t(3 * packets + 2 * assigns) * sizeof(int), 0);
  }
  exchange(stage, tag + kMeta, send, recv, false);
  const int64_t total = stage.recv_assign_offset[Q];
  for (auto* v : {&stage.row_of_assign, &stage.origin, &stage.token, &stage.slot, &stage.expert}) {
    v->clear();
    v->reserve(size_t(total));
  }
  for (size_t q = 0; q < Q; ++q) {
    std::vector<int> meta(recv[q].size() / sizeof(int));
    if (!meta.empty()) std::memcpy(meta.data(), recv[q].data(), recv[q].size());
    size_t pos = 0;
    for (int64_t p = stage.recv_row_offset[q]; p < stage.recv_row_offset[q + 1]; ++p) {
      const int origin = meta[pos], token = meta[pos + 1], count = meta[pos + 2];
      pos += 3;
      for (int a = 0; a < count; ++a, pos += 2) {
        stage.row_of_assign.push_back(int(p));
        stage.origin.push_back(origin);
        stage.token.push_back(token);
        stage.slot.push_back(meta[pos]);
        stage.expert.push_back(meta[pos + 1]);
      }
    }
  }
  if (int64_t(stage.row_of_assign.size()) != total) {
    throw std::logic_error("ExpertDispatcher: metadata does not match the exchanged counts");
  }
}

void ExpertDispatcher::forward_rows(const Stage& stage, int tag, const std::vector<float>& in,
                                    int width, const std::vector<float>* extras_by_handle,
                                    std::vector<float>& out, std::vector<float>* extras_out) {
  const size_t Q = stage.peers.size();
  std::vector<std::vector<float>> packed(Q);
  Transfer t(Q);
  out.assign(size_t(stage.recv_row_offset[Q]) * size_t(width), 0.0f);
  for (size_t q = 0; q < Q; ++q) {
    packed[q].resize(stage.send_rows[q].size() * size_t(width));
    for (size_t p = 0; p < stage.send_rows[q].size(); ++p) {
      std::memcpy(packed[q].data() + p * size_t(width),
                  in.data() + size_t(stage.send_rows[q][p]) * size_t(width),
                  size_t(width) * sizeof(float));
    }
    t.send[q] = packed[q].data();
    t.send_bytes[q] = packed[q].size() * sizeof(float);
    t.recv[q] = out.data() + size_t(stage.recv_row_offset[q]) * size_t(width);
    t.recv_bytes[q] =
        uint64_t(stage.recv_row_offset[q + 1] - stage.recv_row_offset[q]) * uint64_t(width) * 4;
  }
  run_transfer(stage, t, tag + kRows, comm_, links_, world_ranks_, intra_node_bandwidth_,
               traffic_.payload, traffic_.emulated_seconds);
  if (!extras_by_handle) return;
  Transfer e(Q);
  extras_out->assign(size_t(stage.recv_assign_offset[Q]), 0.0f);
  for (size_t q = 0; q < Q; ++q) {
    packed[q].clear();
    for (int h : stage.send_handles[q]) packed[q].push_back((*extras_by_handle)[size_t(h)]);
    e.send[q] = packed[q].data();
    e.send_bytes[q] = packed[q].size() * sizeof(float);
    e.recv[q] = extras_out->data() + stage.recv_assign_offset[q];
    e.recv_bytes[q] = uint64_t(stage.recv_assign_offset[q + 1] - stage.recv_assign_offset[q]) * 4;
  }
  run_transfer(stage, e, tag + kExtras, comm_, links_, world_ranks_, intra_node_bandwidth_,
               traffic_.metadata, traffic_.emulated_seconds);
}

void ExpertDispatcher::reverse_rows(const Stage& stage, int tag,
                                    const std::vector<float>& by_assign, int width, bool payload,
                                    std::vector<float>& by_handle, int64_t handles) {
  const size_t Q = stage.peers.size();
  std::vector<int64_t> offset(Q + 1, 0);
  for (size_t q = 0; q < Q; ++q) offset[q + 1] = offset[q] + int64_t(stage.send_handles[q].size());
  std::vector<float> received(static_cast<size_t>(offset[Q]) * size_t(width));
  Transfer t(Q);
  // Received assignments of one peer are contiguous, so the reverse sends need no packing.
  for (size_t q = 0; q < Q; ++q) {
    t.send[q] = by_assign.data() + size_t(stage.recv_assign_offset[q]) * size_t(width);
    t.send_bytes[q] =
        uint64_t(stage.recv_assign_offset[q + 1] - stage.recv_assign_offset[q]) * width * 4;
    t.recv[q] = received.data() + size_t(offset[q]) * size_t(width);
    t.recv_bytes[q] = uint64_t(offset[q + 1] - offset[q]) * uint64_t(width) * 4;
  }
  run_transfer(stage, t, tag + kReverse, comm_, links_, world_ranks_, intra_node_bandwidth_,
               payload ? traffic_.payload : traffic_.metadata, traffic_.emulated_seconds);
  by_handle.assign(size_t(handles) * size_t(width), 0.0f);
  for (size_t q = 0; q < Q; ++q) {
    for (size_t j = 0; j < stage.send_handles[q].size(); ++j) {
      std::memcpy(by_handle.data() + size_t(stage.send_handles[q][j]) * size_t(width),
                  received.data() + (size_t(offset[q]) + j) * size_t(width),
                  size_t(width) * sizeof(float));
    }
  }
}

std::vector<float> ExpertDispatcher::dispatch(const float* x, const int* expert_idx, int N, int K,
                                              int C) {
  N_ = N;
  K_ = K;
  C_ = C;
  const int P = ep_size();
  for (int64_t i = 0; i < int64_t(N) * K; ++i) {
    if (expert_idx[i] < 0 || expert_idx[i] >= experts_) {
      throw std::out_of_range("ExpertDispatcher::dispatch: expert index " +
                              std::to_string(expert_idx[i]) + " outside [0, " +
                              std::to_string(experts_) + ")");
    }
  }
  const bool hierarchical = mode_ == DispatchMode::Hierarchical;
  const int my_node = node_of_[size_t(rank_)], my_local = local_of_[size_t(rank_)];
  stages_.assign(hierarchical ? 2 : 1, Stage{});

  // Stage 0: from the token's rank to the owner (flat) or to the same local index on the owner's
  // node (hierarchical). `dest` maps an expert to the index of its peer in this stage.
  Stage& first = stages_[0];
  if (hierarchical) {
    for (const auto& node : rank_at_) first.peers.push_back(node[size_t(my_local)]);
    first.self = my_node;
  } else {
    first.peers.resize(size_t(P));
    std::iota(first.peers.begin(), first.peers.end(), 0);
    first.self = rank_;
  }
  auto dest = [&](int e) { return hierarchical ? node_of_[size_t(owner_of(e))] : owner_of(e); };
  const size_t Q0 = first.peers.size();
  first.send_rows.assign(Q0, {});
  first.send_handles.assign(Q0, {});
  std::vector<std::vector<int>> meta(Q0);
  for (int n = 0; n < N; ++n) {
    const int* slots = expert_idx + int64_t(n) * K;
    for (int k = 0; k < K; ++k) {
      const int d = dest(slots[k]);
      bool sent_before = false;
      for (int j = 0; j < k && mode_ != DispatchMode::Flat; ++j) sent_before |= dest(slots[j]) == d;
      if (sent_before) continue;
      // One packet for this (token, destination): this slot, plus later slots going the same
      // way unless every slot travels alone (Flat).
      auto& m = meta[size_t(d)];
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
  build_stage(first, 0, meta);
  std::vector<float> input(x, x + int64_t(N) * C), rows;
  forward_rows(first, 0, input, C, nullptr, rows, nullptr);

  if (hierarchical) {
    // Stage 1: inside the node, each received packet is split by owner; handles are the
    // received assignments of stage 0.
    Stage& second = stages_[1];
    second.peers = rank_at_[size_t(my_node)];
    second.self = my_local;
    const size_t Q1 = second.peers.size();
    second.send_rows.assign(Q1, {});
    second.send_handles.assign(Q1, {});
    meta.assign(Q1, {});
    const int64_t assigns = int64_t(first.row_of_assign.size());
    for (int64_t begin = 0, end = 0; begin < assigns; begin = end) {
      end = begin;
      while (end < assigns &&
             first.row_of_assign[size_t(end)] == first.row_of_assign[size_t(begin)])
        ++end;
      for (int64_t i = begin; i < end; ++i) {
        const int d = local_of_[size_t(owner_of(first.expert[size_t(i)]))];
        bool sent_before = false;
        for (int64_t j = begin; j < i; ++j) {
          sent_before |= local_of_[size_t(owner_of(first.expert[size_t(j)]))] == d;
        }
        if (sent_before) continue;
        auto& m = meta[size_t(d)];
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
    build_stage(second, kTagsPerStage, meta);
    input.swap(rows);
    forward_rows(second, kTagsPerStage, input, C, nullptr, rows, nullptr);
  }

  // Canonical order: by (expert, origin rank, token, slot).
  const Stage& last = stages_.back();
  const size_t M = last.row_of_assign.size();
  std::vector<int> order(M);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const size_t i = size_t(a), j = size_t(b);
    if (last.expert[i] != last.expert[j]) return last.expert[i] < last.expert[j];
    if (last.origin[i] != last.origin[j]) return last.origin[i] < last.origin[j];
    if (last.token[i] != last.token[j]) return last.token[i] < last.token[j];
    return last.slot[i] < last.slot[j];
  });
  canonical_of_assign_.assign(M, 0);
  local_offsets_.assign(size_t(local_experts()) + 1, 0);
  std::vector<float> out(M * size_t(C));
  const int first_expert = rank_ * local_experts();
  for (size_t m = 0; m < M; ++m) {
    const size_t i = size_t(order[m]);
    canonical_of_assign_[i] = int(m);
    ++local_offsets_[size_t(last.expert[i] - first_expert) + 1];
    std::memcpy(out.data() + m * size_t(C), rows.data() + size_t(last.row_of_assign[i]) * size_t(C),
                size_t(C) * sizeof(float));
  }
  for (int e = 0; e < local_experts(); ++e)
    local_offsets_[size_t(e) + 1] += local_offsets_[size_t(e)];
  return out;
}

std::vector<float> ExpertDispatcher::gather_back(const float* local_rows, int width, bool payload) {
  const Stage& last = stages_.back();
  std::vector<float> by_assign(last.row_of_assign.size() * size_t(width)), by_handle;
  for (size_t i = 0; i < last.row_of_assign.size(); ++i) {
    std::memcpy(by_assign.data() + i * size_t(width),
                local_rows + size_t(canonical_of_assign_[i]) * size_t(width),
                size_t(width) * sizeof(float));
  }
  for (size_t s = stages_.size(); s-- > 0;) {
    const int64_t handles =
        s == 0 ? int64_t(N_) * K_ : int64_t(stages_[s - 1].row_of_assign.size());
    reverse_rows(stages_[s], int(s) * kTagsPerStage, by_assign, width, payload, by_handle, handles);
    by_assign.swap(by_handle);
  }
  return by_assign;
}

std::vector<float> ExpertDispatcher::combine(const float* y_local, const float* expert_weight) {
  const std::vector<float> y = gather_back(y_local, C_, true);
  std::vector<float> out(size_t(N_) * size_t(C_));
  // The loop of ref::moe_combine, with y(n, k) at row n K + k.
  for (int64_t n = 0; n < N_; ++n) {
    for (int64_t c = 0; c < C_; ++c) {
      float s = 0;
      for (int64_t k = 0; k < K_; ++k)
        s += expert_weight[n * K_ + k] * y[size_t((n * K_ + k) * C_ + c)];
      out[size_t(n * C_ + c)] = s;
    }
  }
  return out;
}

std::vector<float> ExpertDispatcher::dispatch_backward(const float* dxg_local) {
  const std::vector<float> dxg = gather_back(dxg_local, C_, true);
  std::vector<float> dx(size_t(N_) * size_t(C_));
  // The loop of ref::moe_gather_backward into a zeroed dx.
  for (int64_t n = 0; n < N_; ++n) {
    for (int64_t c = 0; c < C_; ++c) {
      float s = 0;
      for (int64_t k = 0; k < K_; ++k) s += dxg[size_t((n * K_ + k) * C_ + c)];
      dx[size_t(n * C_ + c)] = 0.0f + s;
    }
  }
  return dx;
}

void ExpertDispatcher::combine_backward(const float* dout, const float* y_local,
                                        const float* expert_weight, std::vector<float>& dy_local,
                                        std::vector<float>& dexpert_weight) {
  // dout rows travel the dispatch route (de-duplicated), each assignment's weight with them.
  std::vector<float> rows(dout, dout + int64_t(N_) * C_), next;
  std::vector<float> weights(expert_weight, expert_weight + int64_t(N_) * K_), next_weights;
  for (size_t s = 0; s < stages_.size(); ++s) {
    forward_rows(stages_[s], int(s) * kTagsPerStage, rows, C_, &weights, next, &next_weights);
    rows.swap(next);
    weights.swap(next_weights);
  }
  // The arithmetic of ref::moe_combine_backward into zeroed dy and dexpert_weight.
  const Stage& last = stages_.back();
  const int64_t C = C_;
  dy_local.assign(size_t(local_rows()) * size_t(C), 0.0f);
  std::vector<float> dweight_local(size_t(local_rows()), 0.0f);
  for (size_t i = 0; i < last.row_of_assign.size(); ++i) {
    const int64_t m = canonical_of_assign_[i];
    const float* d = rows.data() + int64_t(last.row_of_assign[i]) * C;
    const float w = weights[i];
    float dot = 0;
    for (int64_t c = 0; c < C; ++c) {
      dy_local[size_t(m * C + c)] += w * d[c];
      dot += d[c] * y_local[m * C + c];
    }
    dweight_local[size_t(m)] = 0.0f + dot;
  }
  dexpert_weight = gather_back(dweight_local.data(), 1, false);
}

}  // namespace rlf
