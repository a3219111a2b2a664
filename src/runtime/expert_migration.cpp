#include "src/runtime/expert_migration.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/huge_pages.h"
#include "src/model/expert_parallel.h"
#include "src/runtime/expert_replicas.h"
#include "src/runtime/memory_blocks.h"

namespace rlf {

uint64_t copy_experts_into_slots(const std::vector<std::vector<int>>& old_slot_expert,
                                 const std::vector<std::vector<int>>& new_slot_expert, int experts,
                                 int local_slots,
                                 const std::vector<std::vector<ParameterRange>>& slot_ranges,
                                 const std::vector<float*>& buffers, MPI_Comm ep_comm,
                                 Links* links) {
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
  if (RoutingLog* log = links ? links->routing_log() : nullptr) {
    // The copies' inputs, for plan --validate (mpi_comm/routing_log.h): tables and slot sizes.
    const LoggedSlots logged = logged_slots(*links, ep_comm, local_slots, slot_ranges);
    log->slot_copies(rank, local_slots, experts, int32_t(buffers.size()), logged.links_node,
                     old_slot_expert, new_slot_expert, logged.slot_floats);
  }
  // One expert's slices of every buffer, buffer after buffer: `offset` into the staging buffer
  // for a copy this rank sends.
  struct Copy {
    size_t layer;
    int source, target;
    size_t offset = 0;
  };
  std::vector<Copy> outgoing, incoming;
  size_t staged = 0;
  for (size_t l = 0; l < new_slot_expert.size(); ++l) {
    if (new_slot_expert[l].size() != old_slot_expert[l].size()) {
      throw std::invalid_argument("copy_experts_into_slots: tables of different slot counts");
    }
    // A layer the ranks do not store (a pipeline stage's EP group follows every layer's table,
    // moving only its own layers' experts): nothing to copy, no message.
    if (slot_ranges[l * size_t(local_slots)].empty()) continue;
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
        outgoing.push_back({l, source, target, staged});
        staged += size_t(ranges_size(local(l, source))) * buffers.size();
      }
      if (target / local_slots == rank) incoming.push_back({l, source, target});
    }
  }
  // Everything leaving this rank is staged before anything lands, so a slot that both sends and
  // receives (a cycle of moves) sends its old expert. The staging buffer lives on between
  // migrations: freshly mapped pages cost a fault each on first touch, which dominated a
  // migration's time here (a 21 MB send took 265 ms to stage into new vectors, 4.5 ms to unpack).
  // On huge pages too (kernels/huge_pages.h): its first growth faulted in 37.7 MB a page at a
  // time, 121 ms of `small`'s first migration at EP 2.
  thread_local std::vector<float, HugePageAllocator<float>> staging;
  if (staging.size() < staged) staging.resize(staged);
  for (const Copy& out : outgoing) {
    float* to = staging.data() + out.offset;
    for (const float* buffer : buffers)
      to = pack_ranges_into(buffer, local(out.layer, out.source), to);
  }
  // A received expert lands straight in its slot's slices of every buffer (a datatype over them,
  // in the staged order); a copy inside this rank comes from the staging buffer. Both ends of
  // every pair post their messages in (layer, target slot) order, so one tag suffices.
  constexpr int kTag = 7401;
  std::vector<MPI_Request> requests;
  std::vector<MPI_Datatype> types;
  requests.reserve(outgoing.size() + incoming.size());
  for (const Copy& in : incoming) {
    if (in.source / local_slots == rank) continue;
    MemoryBlocks blocks;
    for (float* buffer : buffers)
      for (const ParameterRange& r : local(in.layer, in.target))
        blocks.add(buffer + r.offset, r.count);
    types.push_back(blocks.type());
    requests.emplace_back();
    MPI_Irecv(MPI_BOTTOM, 1, types.back(), in.source / local_slots, kTag, ep_comm,
              &requests.back());
  }
  uint64_t sent = 0;
  for (const Copy& out : outgoing) {
    const int64_t count = ranges_size(local(out.layer, out.source)) * int64_t(buffers.size());
    if (out.target / local_slots == rank) {  // a copy inside this rank: no message
      const float* from = staging.data() + out.offset;
      for (float* buffer : buffers)
        from = unpack_ranges(from, local(out.layer, out.target), buffer);
      continue;
    }
    requests.emplace_back();
    MPI_Isend(staging.data() + out.offset, int(count), MPI_FLOAT, out.target / local_slots, kTag,
              ep_comm, &requests.back());
    sent += uint64_t(count) * sizeof(float);
    if (links) {
      links->count_send(links->world_rank_of(out.target / local_slots, ep_comm),
                        uint64_t(count) * sizeof(float));
    }
  }
  MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  for (MPI_Datatype& type : types) MPI_Type_free(&type);
  return sent;
}

uint64_t move_expert_slots(const std::vector<int>& old_slot_of, const std::vector<int>& new_slot_of,
                           const ParameterLayout& layout, int local_experts,
                           const std::vector<float*>& buffers, MPI_Comm ep_comm, int layer,
                           Links* links) {
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
      local_experts, slot_ranges, buffers, ep_comm, links);
}

}  // namespace rlf
