// The expert dispatchers' inputs on one rank, in the order its dispatchers saw them (`train
// --trace-routing`, trace.h5 /rank_NNNNN/routing): each dispatcher's EP group, its slot tables,
// every dispatch's router choices (top-k expert ids per token) and the operations that reuse a
// dispatch's plan. The bytes the dispatchers move follow from these alone (mpi_comm/
// expert_dispatch.h's byte model), which is what `plan --validate` derives from them
// (src/sim/dispatch_replay.h): the routing is the run's, every message is the rule's.
//
// The log is one stream of int32 values, records one after another, each [kind, dispatcher, ...]:
//   Dispatcher: mode, EP size P, EP rank, experts, slots per rank, then per EP rank (P each) its
//               Links node, its node index in the dispatcher's hierarchy and its local index there
//   Slots:      the slot count S, then the expert in each slot (S values)
//   Dispatch:   tokens N, top-k K, row width C (floats), then N * K expert ids (token-major)
//   Combine, CombineBackward, DispatchBackward: nothing more (they reuse the last dispatch's plan)
// Dispatchers are numbered in the order this rank built them, from 0.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace rlf {

enum class RoutingRecord : int32_t {
  Dispatcher = 1,
  Slots = 2,
  Dispatch = 3,
  Combine = 4,
  CombineBackward = 5,
  DispatchBackward = 6,
};

class RoutingLog {
 public:
  // A new dispatcher's group; returns its number. Each vector has one entry per EP rank.
  int32_t add_dispatcher(int32_t mode, int32_t ep_rank, int32_t experts, int32_t slots_per_rank,
                         const std::vector<int>& links_node, const std::vector<int>& group_node,
                         const std::vector<int>& local_index);
  void slots(int32_t dispatcher, const std::vector<int>& slot_expert);
  void dispatch(int32_t dispatcher, int N, int K, int C, const int* expert_idx);
  // Combine, CombineBackward or DispatchBackward.
  void operation(int32_t dispatcher, RoutingRecord kind);

  const std::vector<int32_t>& records() const { return records_; }
  std::vector<int32_t> take() { return std::move(records_); }

 private:
  std::vector<int32_t> records_;
  int32_t dispatchers_ = 0;
};

}  // namespace rlf
