#include "src/runtime/expert_replicas.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "src/model/expert_parallel.h"

namespace rlf {

namespace {

constexpr int kReplicaGradientTag = 7411;

std::vector<float> pack(const float* data, const std::vector<ParameterRange>& ranges) {
  std::vector<float> packed;
  for (const ParameterRange& r : ranges)
    packed.insert(packed.end(), data + r.offset, data + r.offset + r.count);
  return packed;
}

void unpack(const std::vector<float>& packed, const std::vector<ParameterRange>& ranges,
            float* data) {
  size_t at = 0;
  for (const ParameterRange& r : ranges) {
    std::memcpy(data + r.offset, packed.data() + at, size_t(r.count) * sizeof(float));
    at += size_t(r.count);
  }
}

}  // namespace

std::vector<std::vector<std::vector<int>>> replica_slots(
    const std::vector<std::vector<int>>& slot_expert, int experts) {
  std::vector<std::vector<std::vector<int>>> holders(slot_expert.size());
  for (size_t l = 0; l < slot_expert.size(); ++l) {
    holders[l].assign(size_t(experts), {});
    for (size_t s = 0; s < slot_expert[l].size(); ++s) {
      const int e = slot_expert[l][s];
      if (e == kEmptySlot) continue;
      if (e < 0 || e >= experts) {
        throw std::invalid_argument("replica_slots: expert " + std::to_string(e) + " outside [0, " +
                                    std::to_string(experts) + ")");
      }
      holders[l][size_t(e)].push_back(int(s));
    }
  }
  return holders;
}

uint64_t sum_replica_gradients(const std::vector<std::vector<int>>& slot_expert, int experts,
                               int local_slots,
                               const std::vector<std::vector<ParameterRange>>& slot_ranges,
                               float* grads, MPI_Comm ep_comm, Links* links) {
  int rank = 0;
  MPI_Comm_rank(ep_comm, &rank);
  if (slot_ranges.size() != slot_expert.size() * size_t(local_slots)) {
    throw std::invalid_argument("sum_replica_gradients: " + std::to_string(slot_ranges.size()) +
                                " slot ranges for " + std::to_string(slot_expert.size()) +
                                " layers of " + std::to_string(local_slots) + " local slots");
  }
  if (RoutingLog* log = links ? links->routing_log() : nullptr) {
    // The sums' inputs, for plan --validate: the tables and the slots' sizes.
    const LoggedSlots logged = logged_slots(*links, ep_comm, local_slots, slot_ranges);
    log->replica_sums(rank, local_slots, experts, logged.links_node, slot_expert,
                      logged.slot_floats);
  }
  const auto holders = replica_slots(slot_expert, experts);
  // One entry per (layer, replicated expert) this rank holds: its slice and, per holder in
  // slot order, the slice that holder computed (its own slot's is `mine`).
  struct Shared {
    const std::vector<ParameterRange>* ranges;
    std::vector<int> slots;
    std::vector<std::vector<float>> by_holder;
  };
  std::vector<Shared> shared;
  for (size_t l = 0; l < holders.size(); ++l) {
    for (const std::vector<int>& slots : holders[l]) {
      if (slots.size() < 2) continue;
      for (size_t h = 0; h < slots.size(); ++h) {
        if (slots[h] / local_slots != rank) continue;
        const auto& ranges = slot_ranges[l * size_t(local_slots) + size_t(slots[h] % local_slots)];
        Shared s{&ranges, slots, std::vector<std::vector<float>>(slots.size())};
        s.by_holder[h] = pack(grads, ranges);
        shared.push_back(std::move(s));
      }
    }
  }
  // Every pair of holders posts its messages in the same (layer, expert) order, so one tag
  // suffices (MPI matches messages of one pair in order).
  std::vector<MPI_Request> requests;
  uint64_t sent = 0;
  for (Shared& s : shared) {
    size_t mine = 0;
    while (s.slots[mine] / local_slots != rank) ++mine;
    const std::vector<float>& own = s.by_holder[mine];
    for (size_t h = 0; h < s.slots.size(); ++h) {
      if (h == mine) continue;
      const int peer = s.slots[h] / local_slots;
      s.by_holder[h].resize(own.size());
      requests.emplace_back();
      MPI_Irecv(s.by_holder[h].data(), int(own.size()), MPI_FLOAT, peer, kReplicaGradientTag,
                ep_comm, &requests.back());
      requests.emplace_back();
      MPI_Isend(own.data(), int(own.size()), MPI_FLOAT, peer, kReplicaGradientTag, ep_comm,
                &requests.back());
      sent += own.size() * sizeof(float);
      if (links) links->count_send(links->world_rank_of(peer, ep_comm), own.size() * sizeof(float));
    }
  }
  MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  for (const Shared& s : shared) {
    std::vector<float> sum(s.by_holder[0].size(), 0.0f);
    for (const std::vector<float>& part : s.by_holder)
      for (size_t j = 0; j < sum.size(); ++j) sum[j] += part[j];
    unpack(sum, *s.ranges, grads);
  }
  return sent;
}

std::vector<bool> counts_in_norm(const std::vector<std::vector<int>>& slot_expert, int experts,
                                 int local_slots, int ep_rank) {
  const auto holders = replica_slots(slot_expert, experts);
  std::vector<bool> counted(holders.size() * size_t(local_slots), false);
  for (size_t l = 0; l < holders.size(); ++l) {
    for (const std::vector<int>& slots : holders[l]) {
      if (!slots.empty() && slots[0] / local_slots == ep_rank)
        counted[l * size_t(local_slots) + size_t(slots[0] % local_slots)] = true;
    }
  }
  return counted;
}

LoggedSlots logged_slots(Links& links, MPI_Comm ep_comm, int local_slots,
                         const std::vector<std::vector<ParameterRange>>& slot_ranges) {
  LoggedSlots logged;
  int size = 1;
  MPI_Comm_size(ep_comm, &size);
  for (int r = 0; r < size; ++r)
    logged.links_node.push_back(links.node_of(links.world_rank_of(r, ep_comm)));
  for (size_t at = 0; at < slot_ranges.size(); ++at) {
    if (at % size_t(local_slots) == 0) logged.slot_floats.emplace_back();
    logged.slot_floats.back().push_back(ranges_size(slot_ranges[at]));
  }
  return logged;
}

}  // namespace rlf
