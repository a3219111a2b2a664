#include "src/runtime/expert_migration.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "src/model/expert_parallel.h"
#include "src/runtime/expert_replicas.h"

namespace rlf {

uint64_t copy_experts_into_slots(const std::vector<std::vector<int>>& old_slot_expert,
                                 const std::vector<std::vector<int>>& new_slot_expert, int experts,
                                 int local_slots,
                                 const std::vector<std::vector<ParameterRange>>& slot_ranges,
                                 const std::vector<float*>& buffers, MPI_Comm ep_comm) {
  if (old_slot_expert.size() != new_slot_expert.size() ||
      slot_ranges.size() != old_slot_expert.size() * size_t(local_slots)) {
    throw std::invalid_argument("copy_experts_into_slots: tables or ranges of different layers");
  }
  int rank = 0;
  MPI_Comm_rank(ep_comm, &rank);
  const auto old_holders = replica_slots(old_slot_expert, experts);
  auto local = [&](size_t l, int slot) -> const std::vector<ParameterRange>& {
    return slot_ranges[l * size_t(local_slots) + size_t(slot % local_slots)];
  };
  // Everything leaving this rank is packed before anything lands, so a slot that both sends and
  // receives (a cycle of moves) sends its old expert.
  struct Copy {
    size_t layer;
    int source, target;
    std::vector<float> data;
  };
  std::vector<Copy> outgoing, incoming;
  for (size_t l = 0; l < new_slot_expert.size(); ++l) {
    if (new_slot_expert[l].size() != old_slot_expert[l].size()) {
      throw std::invalid_argument("copy_experts_into_slots: tables of different slot counts");
    }
    for (size_t s = 0; s < new_slot_expert[l].size(); ++s) {
      const int expert = new_slot_expert[l][s], target = int(s);
      if (expert == old_slot_expert[l][s]) continue;
      const std::vector<int>& holders = old_holders[l][size_t(expert)];
      if (holders.empty()) {
        throw std::invalid_argument("copy_experts_into_slots: expert " + std::to_string(expert) +
                                    " had no slot to copy from");
      }
      int source = holders[size_t(target) % holders.size()];
      for (int h : holders)
        if (h / local_slots == target / local_slots) source = h;
      if (source / local_slots == rank) {
        Copy c{l, source, target, {}};
        for (float* buffer : buffers) {
          const std::vector<float> part = pack_ranges(buffer, local(l, source));
          c.data.insert(c.data.end(), part.begin(), part.end());
        }
        outgoing.push_back(std::move(c));
      }
      if (target / local_slots == rank) {
        const int64_t count = ranges_size(local(l, target)) * int64_t(buffers.size());
        incoming.push_back({l, source, target, std::vector<float>(static_cast<size_t>(count))});
      }
    }
  }
  // Both ends of every pair post their messages in (layer, target slot) order, so one tag
  // suffices (MPI matches one pair's messages in order).
  constexpr int kTag = 7401;
  std::vector<MPI_Request> requests;
  requests.reserve(outgoing.size() + incoming.size());
  for (Copy& in : incoming) {
    if (in.source / local_slots == rank) continue;
    requests.emplace_back();
    MPI_Irecv(in.data.data(), int(in.data.size()), MPI_FLOAT, in.source / local_slots, kTag,
              ep_comm, &requests.back());
  }
  uint64_t sent = 0;
  for (Copy& out : outgoing) {
    if (out.target / local_slots == rank) {  // a copy inside this rank: no message
      for (Copy& in : incoming)
        if (in.layer == out.layer && in.target == out.target) in.data = out.data;
      continue;
    }
    requests.emplace_back();
    MPI_Isend(out.data.data(), int(out.data.size()), MPI_FLOAT, out.target / local_slots, kTag,
              ep_comm, &requests.back());
    sent += out.data.size() * sizeof(float);
  }
  MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  for (const Copy& in : incoming) {
    const std::vector<ParameterRange>& ranges = local(in.layer, in.target);
    const int64_t per_buffer = ranges_size(ranges);
    for (size_t b = 0; b < buffers.size(); ++b)
      unpack_ranges(in.data.data() + int64_t(b) * per_buffer, ranges, buffers[b]);
  }
  return sent;
}

uint64_t move_expert_slots(const std::vector<int>& old_slot_of, const std::vector<int>& new_slot_of,
                           const ParameterLayout& layout, int local_experts,
                           const std::vector<float*>& buffers, MPI_Comm ep_comm, int layer) {
  const int experts = int(old_slot_of.size());
  for (const std::vector<int>* table : {&old_slot_of, &new_slot_of}) {
    std::vector<int> sorted = *table;
    std::sort(sorted.begin(), sorted.end());
    for (size_t e = 0; e < sorted.size(); ++e) {
      if (sorted.size() != old_slot_of.size() || sorted[e] != int(e)) {
        throw std::invalid_argument(
            "move_expert_slots: a table is not a permutation of the experts");
      }
    }
  }
  // As slot tables, one per layer concerned (one table for every layer when `layer` < 0).
  auto slot_expert = [experts](const std::vector<int>& slot_of) {
    std::vector<int> table(static_cast<size_t>(experts));
    for (int e = 0; e < experts; ++e) table[size_t(slot_of[size_t(e)])] = e;
    return table;
  };
  std::vector<int> layers;
  for (int l = 0; l < expert_layers(layout); ++l)
    if (layer < 0 || l == layer) layers.push_back(l);
  int rank = 0;
  MPI_Comm_rank(ep_comm, &rank);
  std::vector<std::vector<ParameterRange>> slot_ranges;  // slot s is expert s of the layout
  for (int l : layers) {
    for (int i = 0; i < local_experts; ++i)
      slot_ranges.push_back(expert_slices(layout, rank * local_experts + i, 1, l));
  }
  return copy_experts_into_slots(
      std::vector<std::vector<int>>(layers.size(), slot_expert(old_slot_of)),
      std::vector<std::vector<int>>(layers.size(), slot_expert(new_slot_of)), experts,
      local_experts, slot_ranges, buffers, ep_comm);
}

}  // namespace rlf
