// Weight sync learners -> actors when either role shards its experts (--expert-parallel,
// --actor-expert-parallel), rank to rank: learner 0 broadcasts the replicated tensors (packed,
// by WeightSync's hierarchical broadcast); every actor gets each routed expert it stores from the
// learner of replica 0 that holds it, one message per (learner, actor) pair that share experts.
// No rank sends an expert it does not hold or receives one it does not store. Learners may have
// moved experts between their slots (expert migration: learner 0 sends its expert -> slot tables,
// one per layer, to every actor first); actors always store experts in the identity placement,
// by expert id. With redundant slots on the learners (--redundant-experts R: E / learner_ep + R
// slots per learner) the tables name each expert's first replica, which alone sends it.
#pragma once

#include <cstdint>
#include <vector>

#include "mpi_comm/topology.h"
#include "src/model/expert_parallel.h"
#include "src/model/parameter_layout.h"
#include "src/runtime/weight_sync.h"

namespace rlf {

class ExpertWeightSync {
 public:
  // Collective over `world` (the communicator `topology` was built on).
  ExpertWeightSync(MPI_Comm world, Topology& topology, int experts, int learner_ep, int actor_ep,
                   int learner_redundant_slots = 0);
  ~ExpertWeightSync();
  ExpertWeightSync(const ExpertWeightSync&) = delete;
  ExpertWeightSync& operator=(const ExpertWeightSync&) = delete;

  // Learners of replica 0 send, actors receive into `params` (this rank's model, `layout`);
  // every other rank returns at once. `learner_slots`: on learners, their expert -> slot tables
  // ([layer][expert]; null or empty: the identity); ignored on actors. Returns the bytes this
  // rank sent or received.
  uint64_t sync(float* params, const ParameterLayout& layout, WeightSync& replicated,
                const std::vector<std::vector<int>>* learner_slots = nullptr);

 private:
  Topology& topology_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int experts_, learner_ep_, actor_ep_, learner_redundant_slots_;
};

}  // namespace rlf
