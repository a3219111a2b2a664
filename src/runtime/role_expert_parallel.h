// Expert parallelism inside one role (the learners or the actors) of a multi-rank run.
//
// The role's ranks form EP groups of `degree` consecutive role ranks; each group holds one
// data-parallel replica of the model, its routed experts sharded over the group (EP rank r owns
// experts [r E / degree, (r + 1) E / degree)). The ranks that own the same experts in the
// different replicas form an expert-data-parallel group. Gradients then take two reductions: the
// replicated tensors over the whole role, each rank's own experts over its expert-data-parallel
// group only; the optimizer updates only what the rank owns.
//
// Storage: a model built with shard() stores only this rank's experts (weights, gradients and
// optimizer moments); a model with the full layout works too (without redundant slots) and then
// reads and updates only its own experts' slices. gather_full_model assembles the whole model on
// EP rank 0 of replica 0 (learner 0 evaluates and saves it).
//
// Redundant slots (`--redundant-experts R`, docs/EDPB.md): every EP rank holds E / degree + R
// expert slots (shard() is then a slot-space ExpertShard), the spare ones replicas of hot experts
// placed by the rebalancer. A replica's tokens are split over its holders by the dispatcher, its
// gradient summed over them (sum_replica_gradients) so AdamW keeps every replica bit-identical,
// the clipping norm counts each expert once (its first replica), and everything that leaves the
// learners (the gathered model, checkpoints, the weight sync) takes each expert's first replica.
#pragma once

#include <memory>
#include <vector>

#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/topology.h"
#include "src/model/optimizer.h"
#include "src/model/overlapped_experts.h"
#include "src/model/transformer.h"

namespace rlf {

// ConfigError (same text on every rank: arithmetic on the layout only) unless `degree` >= 1
// divides both the role's rank count and the experts, and, for hierarchical dispatch, every EP
// group has the same number of ranks on each of its nodes. `what` names the option
// ("--expert-parallel"), `role` the role ("learner").
void validate_role_expert_parallel(const char* what, int degree,
                                   const std::vector<int>& role_world_ranks, int experts,
                                   DispatchMode mode, const Links& links, const char* role);

class RoleExpertParallel {
 public:
  // Collective over role.comm. `degree` must have passed validate_role_expert_parallel and
  // `redundant_slots` validate_redundant_slots.
  RoleExpertParallel(const HierarchicalComm& role, Links& links, int experts, int degree,
                     DispatchMode mode, int redundant_slots = 0);
  ~RoleExpertParallel();
  RoleExpertParallel(const RoleExpertParallel&) = delete;
  RoleExpertParallel& operator=(const RoleExpertParallel&) = delete;

  int degree() const { return degree_; }
  int ep_rank() const { return ep_rank_; }
  int replica() const { return replica_; }
  // The experts this rank owns: [ep_rank() E / degree(), (ep_rank() + 1) E / degree()), and
  // redundant_slots() spare slots (the layout a model built with it stores).
  ExpertShard shard() const {
    return {ep_rank_ * (experts_ / degree_), experts_ / degree_, redundant_};
  }
  int redundant_slots() const { return redundant_; }
  // Expert slots per EP rank: E / degree() + redundant_slots().
  int local_slots() const { return experts_ / degree_ + redundant_; }
  const HierarchicalComm& ep_group() const { return ep_group_; }
  // The links (node of every rank, emulation) the EP group's transfers go over.
  const Links& links() const { return links_; }
  const HierarchicalComm& expert_data_group() const { return expert_data_group_; }

  // Gives `model` one new dispatcher per layer over this rank's EP group (collective over it);
  // from then on the model's forward, backward and generation are collective over the group.
  // overlap_chunks > 1 also gives its training forward and backward one OverlappedExperts per
  // layer: the routed experts in that many chunks, transfers overlapped with the expert FFN.
  void attach(Transformer<float>& model, int overlap_chunks = 1);
  // Like attach, but every call gets the same dispatchers (made by the first call): for a model
  // rebuilt every generation phase, without new communicators each time.
  void attach_reusing(Transformer<float>& model);
  // The same dispatchers as a set of `layers` (made by the first call, of either): for the views
  // of a pipeline stage's forward-only passes (the KL reference's and the proximal log-probs),
  // whose routing stays out of training's router statistics (take_view_expert_tokens).
  std::vector<ExpertDispatcher*> reused_dispatchers(int layers);
  // The `index`-th set of `layers` per-layer dispatchers for views of a model (a pipeline stage's
  // micro-batch chunks in flight, PipelineStage::set_expert_dispatchers: each keeps its own
  // dispatch plan), made on first use (collective over the EP group); migrations reach them too.
  std::vector<ExpertDispatcher*> view_dispatchers(int index, int layers);
  // With overlap chunks inside a pipeline stage: one new OverlappedExperts of `chunks` chunks per
  // layer of `config` for one view (PipelineStage::set_expert_overlap), its FFN work buffers in
  // `scratch` (the view's activation arena: it must outlive them, so a stage asks once per
  // arena). Collective over the EP group; kept here, so migrations reach them.
  std::vector<OverlappedExperts*> make_view_overlap(const ModelConfig& config, int chunks,
                                                    const Ops<float>& ops, Arena& scratch);
  // After the parameters of a model built with shard() are set (initialized, loaded or copied
  // from a whole model): every spare slot receives its expert from the rank that owns it (weights
  // only: AdamW moments start at zero everywhere). Collective over the EP group; nothing to do
  // without redundant slots. Returns the bytes this rank sent.
  uint64_t fill_redundant_slots(float* params, const ParameterLayout& layout);
  // The shard AdamW updates on this rank (replicated tensors, own expert slots). The clipping
  // norm counts each expert once: its first replica's slot.
  OptimizerShard optimizer_shard(const ParameterLayout& layout) const;
  // Sums the gradients of the replicated tensors over the role and those of this rank's expert
  // slots over its expert-data-parallel group, then each replicated expert's over its replicas
  // (collective over the role). Returns the bytes this rank sent.
  uint64_t reduce_gradients(float* grads, const ParameterLayout& layout);
  // Collective over replica 0's EP group (other replicas return at once): EP rank 0 of replica 0
  // gets the whole model in `full` (a full layout; ignored elsewhere): the replicated tensors
  // from its own `params`, every expert from its owner. Returns the bytes this rank sent or
  // received.
  uint64_t gather_full_model(const float* params, const ParameterLayout& layout, float* full,
                             const ParameterLayout& full_layout);

  // Expert migration (collective over the EP group; every rank passes the same tables): each
  // layer has its own expert -> slot table (slot_of[l], a permutation of the experts); every
  // expert whose slot changes in a layer moves its slices of that layer's tensors in `buffers`
  // (laid out by `layout`: parameters, AdamW moments) to the rank of its new slot, and every
  // dispatcher made by attach (the overlap chunks' too) routes by its layer's table. Returns the
  // bytes this rank sent.
  uint64_t migrate_experts(const std::vector<std::vector<int>>& slot_of,
                           const ParameterLayout& layout, const std::vector<float*>& buffers);
  // The same table for every layer.
  uint64_t migrate_experts(const std::vector<int>& slot_of, const ParameterLayout& layout,
                           const std::vector<float*>& buffers);
  // The same with replicas: slot_expert[l] names the expert in every slot of layer l
  // (degree() x local_slots(), ExpertDispatcher::set_slot_experts); every slot whose expert
  // changes receives it from a holder (copy_experts_into_slots).
  uint64_t migrate_slots(const std::vector<std::vector<int>>& slot_expert,
                         const ParameterLayout& layout, const std::vector<float*>& buffers);
  // The tables of a checkpoint (the same on every rank of the EP group, `layers` of them) put in
  // force without moving anything: the caller then fills every slot with its expert (reading it
  // from the file). Checked like migrate_slots' tables (std::invalid_argument); no communication.
  void adopt_slots(const std::vector<std::vector<int>>& slot_expert, int layers);
  // The expert -> slot tables in force, [layer][expert]: each expert's first replica (identity
  // until migrate_experts; empty before attach).
  const std::vector<std::vector<int>>& expert_slots() const { return slot_of_; }
  // The slot -> expert tables in force, [layer][slot] (default_slot_experts until migrated).
  const std::vector<std::vector<int>>& slot_experts() const { return slot_expert_; }
  // (layer, expert) pairs held in more than one slot.
  int replicated_experts() const;

  // Layer `layer`'s (token, expert) assignments per expert dispatched through every set of
  // view_dispatchers and of make_view_overlap (whose chunks dispatch instead of the view's
  // dispatchers) since the last call (a pipeline stage's router statistics: every micro-batch
  // chunk's forwards), [expert].
  std::vector<int64_t> take_view_expert_tokens(int layer);

  // Dispatch traffic of every dispatcher made by attach (payload and metadata, this rank).
  DispatchTraffic traffic() const;
  // The communication time of every dispatcher made here (overlap chunks' too), summed
  // (SplitPhaseChain::Time, this rank): differences around a phase give its EP communication
  // time and the part of it that was exposed.
  SplitPhaseChain::Time communication_time() const;

 private:
  const HierarchicalComm& role_;
  Links& links_;
  int experts_, degree_, ep_rank_, replica_, redundant_;
  DispatchMode mode_;
  HierarchicalComm ep_group_, expert_data_group_;
  std::vector<std::unique_ptr<ExpertDispatcher>> dispatchers_;
  std::vector<std::unique_ptr<OverlappedExperts>> overlapped_;
  std::vector<ExpertDispatcher*> reused_;  // the dispatchers attach_reusing hands out
  std::vector<std::vector<ExpertDispatcher*>> view_sets_;  // view_dispatchers' sets
  // make_view_overlap's sets.
  std::vector<std::vector<OverlappedExperts*>> view_overlap_sets_;
  void ensure_tables(int layers);  // default tables for `layers` layers, if none yet
  // Puts checked tables in force: the first-replica tables and every dispatcher's routing.
  void route_by(const std::vector<std::vector<int>>& slot_expert);
  std::unique_ptr<ExpertDispatcher> make_dispatcher(int layer);  // routing by the layer's table
  // One new dispatcher per layer (kept in dispatchers_, so migrations reach them).
  std::vector<ExpertDispatcher*> make_dispatcher_set(int layers);
  // One OverlappedExperts per layer of `config` (kept in overlapped_).
  std::vector<OverlappedExperts*> make_overlap_set(const ModelConfig& config, int chunks,
                                                   const Ops<float>& ops, Arena& scratch);
  // Every dispatcher made here, the overlap chunks' included.
  std::vector<const ExpertDispatcher*> all_dispatchers() const;
  // std::invalid_argument unless `table` holds every expert, never twice on one rank.
  void check_slot_table(const std::vector<int>& table) const;
  // Where local slot i of layer l lies in a buffer laid out by `layout`, [l * local_slots() + i].
  std::vector<std::vector<ParameterRange>> slot_ranges(const ParameterLayout& layout) const;
  std::vector<std::vector<int>> slot_of_;      // [layer][expert] -> its first replica's slot
  std::vector<std::vector<int>> slot_expert_;  // [layer][slot] -> expert
};

}  // namespace rlf
