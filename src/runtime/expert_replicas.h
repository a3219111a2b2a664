// Replicas of hot experts in EP training (redundant expert slots): an expert held in several
// slots (on different EP ranks) gets its tokens split among them by the dispatcher, so each
// replica computes the gradient of its share only. Summing the replicas' gradients (in slot
// order, the same on every holder) gives every replica the same gradient, hence the same AdamW
// update, so the replicas stay bit-identical and together train like the single copy.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "mpi_comm/links.h"
#include "src/model/parameter_layout.h"

namespace rlf {

// A slot that holds no expert yet (a spare slot before its replica is copied in): it has nothing
// to give, so copy_experts_into_slots never takes an expert from it.
constexpr int kEmptySlot = -1;

// Per layer, the slots of every expert in ascending order, from the slot tables
// (slot_expert[layer][slot] -> expert; kEmptySlot entries are skipped).
std::vector<std::vector<std::vector<int>>> replica_slots(
    const std::vector<std::vector<int>>& slot_expert, int experts);

// Collective over `ep_comm` (EP rank r holds slots [r L, (r + 1) L), L = local_slots).
// slot_ranges[l * L + i]: where local slot i of layer l lies in `grads` (the routed-expert
// tensors' slices). Every replicated expert's gradient becomes the sum of its replicas'
// gradients, added in ascending slot order on every holder (so the holders get equal bits);
// unreplicated experts are untouched. Returns the bytes this rank sent (counted on `links` too,
// per link class, when given).
uint64_t sum_replica_gradients(const std::vector<std::vector<int>>& slot_expert, int experts,
                               int local_slots,
                               const std::vector<std::vector<ParameterRange>>& slot_ranges,
                               float* grads, MPI_Comm ep_comm, Links* links = nullptr);

// For the global gradient norm: true for the local slots ([l * L + i]) whose expert is counted
// here, the first replica (lowest slot) of each expert, so every expert counts once.
std::vector<bool> counts_in_norm(const std::vector<std::vector<int>>& slot_expert, int experts,
                                 int local_slots, int ep_rank);

// What the links' routing log records of an EP group's slots (mpi_comm/routing_log.h): each EP
// rank's Links node, and the floats each local slot of each layer holds (slot_ranges[l L + i]).
struct LoggedSlots {
  std::vector<int> links_node;
  std::vector<std::vector<int64_t>> slot_floats;
};
LoggedSlots logged_slots(Links& links, MPI_Comm ep_comm, int local_slots,
                         const std::vector<std::vector<ParameterRange>>& slot_ranges);

}  // namespace rlf
