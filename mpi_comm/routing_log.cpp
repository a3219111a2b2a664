#include "mpi_comm/routing_log.h"

#include <cstdint>
#include <stdexcept>

namespace rlf {

int32_t RoutingLog::add_dispatcher(int32_t mode, int32_t ep_rank, int32_t experts,
                                   int32_t slots_per_rank, const std::vector<int>& links_node,
                                   const std::vector<int>& group_node,
                                   const std::vector<int>& local_index) {
  if (group_node.size() != links_node.size() || local_index.size() != links_node.size()) {
    throw std::invalid_argument("RoutingLog::add_dispatcher: one entry per EP rank in each list");
  }
  const int32_t id = dispatchers_++;
  records_.insert(records_.end(), {int32_t(RoutingRecord::Dispatcher), id, mode,
                                   int32_t(links_node.size()), ep_rank, experts, slots_per_rank});
  for (const std::vector<int>* list : {&links_node, &group_node, &local_index})
    records_.insert(records_.end(), list->begin(), list->end());
  return id;
}

void RoutingLog::slots(int32_t dispatcher, const std::vector<int>& slot_expert) {
  records_.insert(records_.end(),
                  {int32_t(RoutingRecord::Slots), dispatcher, int32_t(slot_expert.size())});
  records_.insert(records_.end(), slot_expert.begin(), slot_expert.end());
}

void RoutingLog::dispatch(int32_t dispatcher, int N, int K, int C, const int* expert_idx) {
  records_.insert(records_.end(), {int32_t(RoutingRecord::Dispatch), dispatcher, N, K, C});
  records_.insert(records_.end(), expert_idx, expert_idx + int64_t(N) * K);
}

namespace {

// Per layer: each table (slots values), then each local slot's floats.
void append_layers(std::vector<int32_t>& records, size_t slots, int32_t local_slots,
                   const std::vector<const std::vector<std::vector<int>>*>& tables,
                   const std::vector<std::vector<int64_t>>& slot_floats) {
  for (size_t l = 0; l < slot_floats.size(); ++l) {
    for (const std::vector<std::vector<int>>* table : tables) {
      if (table->size() != slot_floats.size() || (*table)[l].size() != slots)
        throw std::invalid_argument("RoutingLog: a slot table of the wrong size");
      records.insert(records.end(), (*table)[l].begin(), (*table)[l].end());
    }
    if (slot_floats[l].size() != size_t(local_slots))
      throw std::invalid_argument("RoutingLog: slot sizes of the wrong count");
    for (int64_t floats : slot_floats[l]) {
      if (floats < 0 || floats > INT32_MAX)
        throw std::length_error("RoutingLog: a slot beyond 2^31 floats");
      records.push_back(int32_t(floats));
    }
  }
}

}  // namespace

void RoutingLog::slot_copies(int32_t ep_rank, int32_t local_slots, int32_t experts, int32_t buffers,
                             const std::vector<int>& links_node,
                             const std::vector<std::vector<int>>& old_slot_expert,
                             const std::vector<std::vector<int>>& new_slot_expert,
                             const std::vector<std::vector<int64_t>>& slot_floats) {
  records_.insert(records_.end(),
                  {int32_t(RoutingRecord::SlotCopies), -1, int32_t(links_node.size()), ep_rank,
                   local_slots, experts, buffers, int32_t(slot_floats.size())});
  records_.insert(records_.end(), links_node.begin(), links_node.end());
  append_layers(records_, links_node.size() * size_t(local_slots), local_slots,
                {&old_slot_expert, &new_slot_expert}, slot_floats);
}

void RoutingLog::replica_sums(int32_t ep_rank, int32_t local_slots, int32_t experts,
                              const std::vector<int>& links_node,
                              const std::vector<std::vector<int>>& slot_expert,
                              const std::vector<std::vector<int64_t>>& slot_floats) {
  records_.insert(records_.end(),
                  {int32_t(RoutingRecord::ReplicaSums), -1, int32_t(links_node.size()), ep_rank,
                   local_slots, experts, int32_t(slot_floats.size())});
  records_.insert(records_.end(), links_node.begin(), links_node.end());
  append_layers(records_, links_node.size() * size_t(local_slots), local_slots, {&slot_expert},
                slot_floats);
}

void RoutingLog::expert_switch(int32_t ep_rank, int32_t local_slots, int32_t experts,
                               int64_t expert_floats, const std::vector<int>& links_node,
                               const std::vector<std::vector<int>>& training_slot_expert,
                               const std::vector<std::vector<int>>& generation_experts) {
  if (expert_floats < 0 || expert_floats > INT32_MAX || generation_experts.empty() ||
      generation_experts.size() != training_slot_expert.size()) {
    throw std::invalid_argument("RoutingLog::expert_switch: tables of different layers");
  }
  const size_t wanted = generation_experts.front().size();
  records_.insert(
      records_.end(),
      {int32_t(RoutingRecord::ExpertSwitch), -1, int32_t(links_node.size()), ep_rank, local_slots,
       experts, int32_t(training_slot_expert.size()), int32_t(expert_floats), int32_t(wanted)});
  records_.insert(records_.end(), links_node.begin(), links_node.end());
  for (size_t l = 0; l < training_slot_expert.size(); ++l) {
    if (training_slot_expert[l].size() != links_node.size() * size_t(local_slots) ||
        generation_experts[l].size() != wanted) {
      throw std::invalid_argument("RoutingLog::expert_switch: a table of the wrong size");
    }
    records_.insert(records_.end(), training_slot_expert[l].begin(), training_slot_expert[l].end());
    records_.insert(records_.end(), generation_experts[l].begin(), generation_experts[l].end());
  }
}

void RoutingLog::expert_sync(int32_t ep_rank, int32_t local_slots, int32_t experts,
                             int32_t actor_ep, int32_t actor_tp, int32_t layers,
                             int64_t expert_floats, bool sends_tables, int32_t links_node,
                             const std::vector<int>& actor_links_node,
                             const std::vector<int>& slot_of) {
  if (expert_floats < 0 || expert_floats > INT32_MAX ||
      slot_of.size() != size_t(layers) * size_t(experts)) {
    throw std::invalid_argument("RoutingLog::expert_sync: a table of the wrong size");
  }
  records_.insert(records_.end(),
                  {int32_t(RoutingRecord::ExpertSync), -1, ep_rank, local_slots, experts, actor_ep,
                   actor_tp, layers, int32_t(expert_floats), int32_t(sends_tables),
                   int32_t(actor_links_node.size()), links_node});
  records_.insert(records_.end(), actor_links_node.begin(), actor_links_node.end());
  records_.insert(records_.end(), slot_of.begin(), slot_of.end());
}

void RoutingLog::operation(int32_t dispatcher, RoutingRecord kind) {
  if (kind != RoutingRecord::Combine && kind != RoutingRecord::CombineBackward &&
      kind != RoutingRecord::DispatchBackward) {
    throw std::invalid_argument("RoutingLog::operation: not an operation on a dispatch's plan");
  }
  records_.insert(records_.end(), {int32_t(kind), dispatcher});
}

}  // namespace rlf
