#include "mpi_comm/routing_log.h"

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

void RoutingLog::operation(int32_t dispatcher, RoutingRecord kind) {
  if (kind != RoutingRecord::Combine && kind != RoutingRecord::CombineBackward &&
      kind != RoutingRecord::DispatchBackward) {
    throw std::invalid_argument("RoutingLog::operation: not an operation on a dispatch's plan");
  }
  records_.insert(records_.end(), {int32_t(kind), dispatcher});
}

}  // namespace rlf
