// `train --mode disaggregated --tensor-parallel T`: the learners form TP groups of T consecutive
// learner ranks (learners = TP x DP), each rank holding its TP slice and training with the fused
// TP code; one leader per TP group takes the group's samples from DistQueue; the weight sync sends
// the whole model, which TP group 0 assembles from its slices (learner 0 sends it as without TP).
// The actors generate data-parallel from it, or with --actor-tensor-parallel G in TP groups of G
// consecutive actors, each keeping its slice of it. With --expert-parallel E the learners are TP x
// EP (ExpertWeightSync with the learner TP stride sends the experts from TP rank 0 of each group).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mpi_comm/topology.h"
#include "src/app/disaggregated_train.h"
#include "src/app/rl_options.h"
#include "src/model/tensor_parallel.h"
#include "src/model/transformer.h"
#include "src/roles/dist_queue.h"
#include "src/runtime/expert_weight_sync.h"

namespace rlf {

// ConfigError, the same on every rank before any work, for what disaggregated TP does not build:
// one rank, a negative --actor-tensor-parallel, and rebalancing without EP (the fused TP run's
// refusal; validate_role_tensor_parallel checks the degrees). TP x EP learners and actors are
// built: an EP group is the learners (actors) of one TP rank in E consecutive TP groups.
void validate_disaggregated_tensor_parallel(const DisaggregatedOptions& options, int world_size,
                                            const RlOptions& rl);

// ConfigError "--tensor-parallel T with --mode disaggregated: ..." when T does not divide the
// `learners` learner ranks (--learners), the model's heads or its shared expert; the same for
// --actor-tensor-parallel G and the `actors` actor ranks. Pure arithmetic: every rank (queue ranks
// too) finds the same problem before any collective.
void validate_role_tensor_parallel(const DisaggregatedOptions& options, const ModelConfig& config,
                                   int learners, int actors);

// This rank's TP groups: a learner's at --tensor-parallel, an actor's at --actor-tensor-parallel
// (collective over the rank's role; null on queue ranks and for degree 1).
std::unique_ptr<TensorParallel> make_role_tensor_parallel(const DisaggregatedOptions& options,
                                                          const ModelConfig& config,
                                                          Topology& topology);

// The whole model the weight sync sends, from a TP learner's slice: TP group 0 gathers its slices
// onto TP rank 0 (learner 0) each time; the bytes it received are counted.
class WholeModelForSync {
 public:
  // `tp`: the learner's TP groups (not owned), or null (no TP: the model is sent as it is).
  // `model_layout`: the learner's; with EP the assembled model holds the same expert slots.
  WholeModelForSync(const TensorParallel* tp, const ModelConfig& config,
                    const ParameterLayout& model_layout);

  // Whether this learner takes part in assemble(): TP group 0 (learner 0 alone without TP).
  bool assembles() const { return !tp_ || tp_->replica() == 0; }
  // Collective over TP group 0 (call it on every rank where assembles()): the whole model on
  // learner 0 (its own parameters without TP), null on the other ranks.
  float* assemble(Transformer<float>& model);
  // Bytes TP rank 0 received in the assemblies so far.
  uint64_t gathered_bytes() const { return gathered_bytes_; }
  // The assembled model's layout: every tensor whole, the learner's expert slots.
  const ParameterLayout& layout() const { return whole_layout_; }

 private:
  const TensorParallel* tp_;
  ModelConfig config_;
  ParameterLayout whole_layout_;
  std::vector<float> whole_;  // TP rank 0 of group 0
  uint64_t gathered_bytes_ = 0;
};

// Learner 0's side of the weight sync to actors in TP groups of T consecutive actors without EP:
// each actor TP rank receives only its slice, which learner 0 cuts from the whole model every
// sync (slice r laid out as an actor of TP rank r stores its model).
class ActorSlicesForSync {
 public:
  // `slices` T, or 0 where nothing is cut (every rank but learner 0).
  ActorSlicesForSync(int slices, const ModelConfig& config, bool attention_only);

  // Every slice from `whole` (laid out by ParameterLayout(config)); returns them, slice r at
  // index r.
  std::vector<std::vector<float>>& cut(const float* whole);

 private:
  ParameterLayout whole_layout_;
  std::vector<ParameterLayout> layouts_;
  std::vector<std::vector<float>> slices_;
};

// Learner 0's side of the expert weight sync to actors in TP groups of `actor_tp`: the replicated
// tensors (all but the routed experts) of each actor TP rank's slice of `params` (laid out by
// `layout`, no tensor slice), packed as ExpertWeightSync sends them.
ExpertWeightSync::ReplicatedSlices replicated_actor_slices(const float* params,
                                                           const ParameterLayout& layout,
                                                           const ModelConfig& config, int actor_tp,
                                                           bool attention_only);

// What the TP learners' queue gets cost the shards, summed over the world (collective over
// MPI_COMM_WORLD): summary.json fields (ending in a comma) queue_get_requests, queue_reply_bytes,
// queue_samples_served (what the shards served: each sample once per TP group, not once per TP
// rank), queue_replica_ranks (T: the ranks behind each leader's request),
// weight_sync_gather_bytes (learner 0's assemblies), actor_tensor_parallel (`actor_degree`, 1
// for 0).
std::string learner_tensor_parallel_json(const DistQueue& queue, int degree, int actor_degree,
                                         uint64_t gathered_bytes);

}  // namespace rlf
