// The expert dispatchers' inputs on one rank, in the order its dispatchers saw them (`train
// --trace-routing`, trace.h5 /rank_NNNNN/routing): each dispatcher's EP group, its slot tables,
// every dispatch's router choices (top-k expert ids per token) and the operations that reuse a
// dispatch's plan. The bytes the dispatchers move follow from these alone (mpi_comm/
// expert_dispatch.h's byte model), which is what `plan --validate` derives from them
// (src/sim/dispatch_replay.h): the routing is the run's, every message is the rule's.
//
// The log also holds the inputs of the collectives that follow the slot tables: every copy of
// experts into expert slots (EDPB's migrations and the spare slots' first fill, src/runtime/
// expert_migration.h) and every sum of a replicated expert's gradients over its holders
// (src/runtime/expert_replicas.h), every switch to a generation EP layout of its own (src/
// runtime/layout_switch.h) and every EP learner's weight sync to the actors (src/runtime/
// expert_weight_sync.h): the tables and what a slot holds, from which `plan --validate` derives
// the expert_migration bytes and the placement's parts of gradient_reduce, layout_switch and
// weight_sync.
//
// The log is one stream of int32 values, records one after another, each [kind, dispatcher, ...]:
//   Format:     (dispatcher: the format's version, 2) nothing more; the log's first record
//   Dispatcher: mode, EP size P, EP rank, experts, slots per rank, then per EP rank (P each) its
//               Links node, its node index in the dispatcher's hierarchy and its local index there
//   Slots:      the slot count S, then the expert in each slot (S values)
//   Dispatch:   tokens N, top-k K, row width C (floats), then N * K expert ids (token-major)
//   Combine, CombineBackward, DispatchBackward: nothing more (they reuse the last dispatch's plan)
//   SlotCopies: (dispatcher -1) EP size P, EP rank, local slots L, experts, buffers B, layers N,
//               then per EP rank its Links node, then per layer the table before (P L experts,
//               -1: an empty slot), the table after (P L) and the floats each of this rank's L
//               slots holds in one buffer (0: a layer this rank does not store)
//   ReplicaSums: (dispatcher -1) EP size P, EP rank, local slots L, experts, layers N, then per EP
//               rank its Links node, then per layer the table (P L experts) and the floats of
//               each of this rank's L slots (0: a layer this rank does not store)
//   ExpertSwitch: (dispatcher -1) training EP degree T, EP rank, local slots L, experts, layers N,
//               an expert's floats, generation slots W, then each training EP rank's Links node
//               (T), then per layer the training table (T L experts) and the expert of each of
//               this rank's W generation slots
//   ExpertSync: (dispatcher -1) a sending learner's EP rank, slots per learner, experts, the
//               actors' EP and TP degrees, layers N, an expert's floats, whether it sends the
//               tables (1: learner 0), actors A, its own Links node, each actor's (A), then the
//               learners' expert -> slot table (N x experts)
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
  SlotCopies = 7,
  Format = 8,
  ReplicaSums = 9,
  ExpertSwitch = 10,
  ExpertSync = 11,
};

class RoutingLog {
 public:
  static constexpr int32_t kFormat = 2;  // 1: before SlotCopies (2026-12-07, one session)
  RoutingLog() : records_{int32_t(RoutingRecord::Format), kFormat} {}

  // A new dispatcher's group; returns its number. Each vector has one entry per EP rank.
  int32_t add_dispatcher(int32_t mode, int32_t ep_rank, int32_t experts, int32_t slots_per_rank,
                         const std::vector<int>& links_node, const std::vector<int>& group_node,
                         const std::vector<int>& local_index);
  void slots(int32_t dispatcher, const std::vector<int>& slot_expert);
  void dispatch(int32_t dispatcher, int N, int K, int C, const int* expert_idx);
  // Combine, CombineBackward or DispatchBackward.
  void operation(int32_t dispatcher, RoutingRecord kind);
  // One copy_experts_into_slots on this rank: per layer the tables before and after and the
  // floats of each local slot (slot_floats[l][i]).
  void slot_copies(int32_t ep_rank, int32_t local_slots, int32_t experts, int32_t buffers,
                   const std::vector<int>& links_node,
                   const std::vector<std::vector<int>>& old_slot_expert,
                   const std::vector<std::vector<int>>& new_slot_expert,
                   const std::vector<std::vector<int64_t>>& slot_floats);
  // One ExpertLayoutSwitch::to_generation on this rank: per layer the training table and the
  // experts of its generation slots.
  void expert_switch(int32_t ep_rank, int32_t local_slots, int32_t experts, int64_t expert_floats,
                     const std::vector<int>& links_node,
                     const std::vector<std::vector<int>>& training_slot_expert,
                     const std::vector<std::vector<int>>& generation_experts);
  // One ExpertWeightSync send on this learner: the expert -> slot tables ([layer * experts + e]).
  void expert_sync(int32_t ep_rank, int32_t local_slots, int32_t experts, int32_t actor_ep,
                   int32_t actor_tp, int32_t layers, int64_t expert_floats, bool sends_tables,
                   int32_t links_node, const std::vector<int>& actor_links_node,
                   const std::vector<int>& slot_of);
  // One sum_replica_gradients on this rank: per layer the table and the floats of each local slot.
  void replica_sums(int32_t ep_rank, int32_t local_slots, int32_t experts,
                    const std::vector<int>& links_node,
                    const std::vector<std::vector<int>>& slot_expert,
                    const std::vector<std::vector<int64_t>>& slot_floats);

  const std::vector<int32_t>& records() const { return records_; }
  std::vector<int32_t> take() { return std::move(records_); }

 private:
  std::vector<int32_t> records_;
  int32_t dispatchers_ = 0;
};

}  // namespace rlf
