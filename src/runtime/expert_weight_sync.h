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
#include <memory>
#include <vector>

#include "mpi_comm/topology.h"
#include "src/model/expert_parallel.h"
#include "src/model/parameter_layout.h"
#include "src/runtime/posted_weight_sync.h"
#include "src/runtime/weight_sync.h"

namespace rlf {

class ExpertWeightSync {
 public:
  // Collective over `world` (the communicator `topology` was built on). With `learner_tp` T > 1
  // the learners are TP groups of T consecutive ranks (EP rank = the group's place): TP rank 0 of
  // each group of replica 0 sends its experts (whole on every TP rank), learner 0 the replicated
  // tensors from the model its group assembled. With `actor_tp` G > 1 the actors are TP groups of
  // G consecutive ranks, every rank of a group storing the group's experts (EP rank = the group's
  // place) and receiving them whole.
  ExpertWeightSync(MPI_Comm world, Topology& topology, int experts, int learner_ep, int actor_ep,
                   int learner_redundant_slots = 0, int learner_tp = 1, int actor_tp = 1);
  ~ExpertWeightSync();
  ExpertWeightSync(const ExpertWeightSync&) = delete;
  ExpertWeightSync& operator=(const ExpertWeightSync&) = delete;

  // The replicated tensors as each actor TP rank r stores them (index r: replicated_ranges of its
  // TP slice layout, packed), which learner 0 sends instead of its own when `replicated` has one
  // slice group per actor TP rank (WeightSync's actor_slices).
  using ReplicatedSlices = std::vector<std::vector<float>>;

  // Learners of replica 0 send, actors receive into `params` (this rank's model, `layout`);
  // every other rank returns at once. `learner_slots`: on learners, their expert -> slot tables
  // ([layer][expert]; null or empty: the identity); ignored on actors. With actor TP groups and
  // `replicated.actor_slices()` > 1, learner 0 sends each actor TP rank its `slices` (its TP slice
  // of the replicated tensors, one broadcast per rank) and an actor receives straight into its
  // sliced model; the experts, whole on every TP rank, as before. Returns the bytes this rank
  // sent or received.
  uint64_t sync(float* params, const ParameterLayout& layout, WeightSync& replicated,
                const std::vector<std::vector<int>>* learner_slots = nullptr,
                ReplicatedSlices* slices = nullptr);

  // StaleSync's deeper pipelines (posted_weight_sync.h): the same messages, sent without waiting.
  // Learners of replica 0 complete their previous post (`wait`), then post this version from
  // buffers of their own (learner 0 the replicated tensors through `replicated`); every other
  // learner returns at once. Returns the bytes posted.
  // (With `slices`, each actor TP rank's slice of the replicated tensors: post_slices.)
  uint64_t post(const float* params, const ParameterLayout& layout, PostedWeightSync& replicated,
                const std::vector<std::vector<int>>* learner_slots,
                const PostedWeightSync::Wait& wait, const ReplicatedSlices* slices = nullptr);
  // Actors: the next posted version into `params`, complete when it returns.
  uint64_t receive(float* params, const ParameterLayout& layout, PostedWeightSync& replicated,
                   const PostedWeightSync::Wait& wait);
  // Learners: completes the last post.
  void finish(const PostedWeightSync::Wait& wait);

 private:
  // Who this rank is in the sync, and the learners' expert -> slot tables (the identity off
  // learner 0 until an actor receives them).
  struct Plan {
    Role role = Role::Queue;
    int learner_index = -1;
    int ep_rank = -1;     // a sending learner's EP rank (its TP group's place)
    bool sender = false;  // a learner of replica 0 (with TP, TP rank 0 of its group)
    int layers = 0;
    std::vector<int> slot_of;  // [layer * experts + expert]
  };
  Plan plan(const ParameterLayout& layout,
            const std::vector<std::vector<int>>* learner_slots) const;
  // Layer by layer, the experts of `actor_shard` that learner `l` holds, in expert order, each
  // with its slices (from `slot` on the learner, `expert` on the actor): the message's content on
  // both sides.
  std::vector<ParameterRange> shared_slices(const Plan& plan, const ParameterLayout& layout, int l,
                                            ExpertShard actor_shard, bool by_slot) const;
  // A sender's tables (learner 0) and expert slices to every actor, blocking or posted.
  uint64_t send_routed(const Plan& plan, const float* params, const ParameterLayout& layout,
                       bool posted);
  // An actor's tables and expert slices, learner by learner.
  uint64_t receive_routed(float* params, const ParameterLayout& layout);

  struct Pending {
    std::vector<MPI_Request> requests;
    std::vector<std::shared_ptr<const void>> buffers;
  };

  Topology& topology_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int experts_, learner_ep_, actor_ep_, learner_redundant_slots_, learner_tp_, actor_tp_;
  Pending pending_;  // a learner's last post
};

}  // namespace rlf
