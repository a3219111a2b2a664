// Expert migration inside an EP group: when the expert -> slot table changes (src/balance/
// decides, ExpertDispatcher::set_expert_slots routes), every moved expert's slices of the
// parameters and of each optimizer buffer (AdamW's two moments) go from the rank holding its old
// slot to the rank holding its new one, rank to rank, and land in the new slot. Each value is
// copied bit for bit, so training continues with the same math.
#pragma once

#include <mpi.h>

#include <vector>

#include "mpi_comm/links.h"
#include "src/model/parameter_layout.h"

namespace rlf {

// Collective over `ep_comm` (EP rank r holds slots [r L, (r + 1) L), L = local_slots).
// old_slot_expert[l] and new_slot_expert[l]: the expert in every slot of layer l before and after
// (dispatcher tables, replicas allowed). Every slot whose expert changes receives that expert's
// slices of every buffer (parameters, AdamW moments, ...) from a slot that held it: one on its
// own rank when there is one (a copy), else the old holders in turn by slot. slot_ranges[l L +
// i]: where local slot i of layer l lies in each buffer. Returns the bytes this rank sent; with
// `links`, also counts each message there (per link class, under the scope's traffic kind).
uint64_t copy_experts_into_slots(const std::vector<std::vector<int>>& old_slot_expert,
                                 const std::vector<std::vector<int>>& new_slot_expert, int experts,
                                 int local_slots,
                                 const std::vector<std::vector<ParameterRange>>& slot_ranges,
                                 const std::vector<float*>& buffers, MPI_Comm ep_comm,
                                 Links* links = nullptr);

// Collective over `ep_comm` (EP rank r stores slots [r L, (r + 1) L) with L = local_experts, as
// `layout` says). `buffers`: flat buffers laid out by `layout` (parameters, first moment, second
// moment, ...), the same list on every rank. Both tables are permutations of the experts; they
// place the experts of layer `layer` (-1: of every layer alike). Returns the bytes this rank sent
// to other ranks (counted on `links` too when given).
uint64_t move_expert_slots(const std::vector<int>& old_slot_of, const std::vector<int>& new_slot_of,
                           const ParameterLayout& layout, int local_experts,
                           const std::vector<float*>& buffers, MPI_Comm ep_comm, int layer = -1,
                           Links* links = nullptr);

}  // namespace rlf
