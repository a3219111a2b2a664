// `train --mode fused --pipeline-parallel P`: pipelines of P consecutive ranks each train one
// replica of the policy, every rank its stage's layers, with the 1F1B (or, with
// --virtual-stages, interleaved) schedule over the step's micro-batches; gradients are summed over
// the ranks holding the same stage. Generation runs data-parallel on every rank: before each
// generation phase a rank borrows the other stages' layers (src/runtime/pipeline_layout_switch.h)
// and frees them after. The samples of a pipeline reach its ranks through DistQueue, one leader
// per pipeline fetching them for all of its stages.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "mpi_comm/topology.h"
#include "src/app/disaggregated_train.h"
#include "src/app/pipeline_balance.h"
#include "src/app/rl_options.h"
#include "src/app/train_checkpoints.h"
#include "src/model/pipeline_stage.h"
#include "src/rl/rl_step.h"
#include "src/roles/dist_queue.h"
#include "src/runtime/pipeline_groups.h"
#include "src/runtime/pipeline_step.h"
#include "src/runtime/role_expert_parallel.h"

namespace rlf {

// ConfigError, the same on every rank before any work, for --pipeline-parallel outside what is
// built: a degree, virtual stages or micro-batch count below their minimum, --virtual-stages or
// --micro-batches without a pipeline, one rank, a multi-rank run that is not --mode fused, or
// combined with rebalancing without EP; with
// --tensor-parallel T, T x P not dividing the ranks; with --expert-parallel E, E not dividing the
// pipelines, --redundant-experts, or with TP another --actor-expert-parallel; without
// --expert-parallel, --ep-overlap-chunks above 1; StaleSync with --virtual-stages when
// --group-size is not a multiple of P; --pipeline-pairing
// without a pipeline, without --expert-parallel or with --ep-overlap-chunks above 1 (the chunked
// path's exchanges are not resumable).
void validate_pipeline_parallel_train(const DisaggregatedOptions& options, bool fused,
                                      int world_size, const RlOptions& rl);
// --actor-pipeline-parallel: 1, or (fused) the training pipeline's degree, at the training TP
// degree (generation_tensor_parallel) and the training EP degree, without StaleSync; ConfigError
// naming what does not fit otherwise.
void validate_pipeline_generation(const DisaggregatedOptions& options, bool fused,
                                  const RlOptions& rl);

// The pipelines over the fused ranks (null for --pipeline-parallel 1), each rank generating
// `rank_samples` samples (prompt groups of `group_size`) per step, trained in `minibatches`
// optimizer steps, the layers cut into chunks by --pipeline-balance (src/app/pipeline_balance.h;
// with `measured` every fused rank first times the layers on `probe`'s micro-batch). Throws
// ConfigError on every rank when the degree does not divide the ranks, P x V the model's layers
// (uniform chunks) or the layers per chunk do not add up to them, or the micro-batches do not fit
// the schedule or the pipeline's smallest minibatch. With `tp` (the TP groups over the same ranks),
// TP inside every stage: the pipelines cut the TP replicas, and a model replica's T x P ranks train
// the samples all of them generated. With --expert-parallel, EP inside every stage
// (PipelineGroups).
std::unique_ptr<PipelineGroups> make_train_pipeline(const DisaggregatedOptions& options,
                                                    const ModelConfig& config, int rank_samples,
                                                    int micro_batch, int group_size,
                                                    int minibatches, Topology& topology,
                                                    const StageCostProbe& probe,
                                                    const TensorParallel* tp = nullptr);

// The micro-batches a pipeline runs without --micro-batches: each of the replica's `model_ranks`
// ranks cuts its share (`rank_share` samples: its block, or its block's share of the smallest
// minibatch) into pieces of `micro_batch`.
int pipeline_micro_batches(int model_ranks, int rank_share, int micro_batch);

// [begin, end) of the micro-batches of `count` samples made of `blocks` equal blocks (the model
// replica's ranks' samples, in rank order), each block in pieces of `piece` samples: the
// micro-batches in which the data-parallel run computes each rank's own samples.
std::vector<std::pair<size_t, size_t>> block_pieces(size_t count, int blocks, int piece);

// StaleSync under the interleaved schedule (micro-batches in groups of p = `stages`): splits the
// largest piece (the first of equal ones) in two, the front half the larger, until `bounds` holds
// a multiple of p pieces. Pieces only shrink, so each still fits the stage's activation arena.
// std::logic_error where only single-sample pieces are left (validation keeps the samples a
// multiple of p, so that never happens in `train`).
void split_into_stage_multiple(std::vector<std::pair<size_t, size_t>>& bounds, int stages);

// Bytes of a pipeline stage's activation arena for micro-batches of `sequences` sequences of up to
// `longest_sequence` tokens: room for a whole-model micro-batch, a bound for any chunk.
size_t stage_activation_bytes(const ModelConfig& config, int sequences, int longest_sequence);

// The most sequences a micro-batch of a pipeline rank holds: its block of `rank_samples` cut into
// pieces of `micro_batch`, or with `equal_parts` (the shape's micro-batch count given) the model
// replica's samples in that many parts.
int pipeline_micro_batch_sequences(const PipelineGroups& groups, int micro_batch, int rank_samples,
                                   bool equal_parts);

// The most bytes this rank's stage activation arenas hold at once in training (what the fused fit
// check counts for a pipeline rank's training activations): the most micro-batch chunks it holds
// at once (in_flight_bound) times the largest of its chunks' pipeline_chunk_peak_bytes, for
// micro-batches of `sequences` sequences of `longest_sequence` tokens. `layout`: the stage's;
// `expert_token_split`: its routed experts run on the rank's share of its TP group's tokens.
size_t pipeline_activation_bytes(const PipelineGroups& groups, const ParameterLayout& layout,
                                 int sequences, int longest_sequence,
                                 bool expert_token_split = false);
// The same for stage `stage` of a pipeline of `shape` running `chunks` (pipeline_rank_chunks), no
// communicator needed: what `plan --validate` counts for a run's rank.
size_t pipeline_activation_bytes(const ModelConfig& config, const PipelineShape& shape, int stage,
                                 const std::vector<LayerRange>& chunks,
                                 const ParameterLayout& layout, int sequences, int longest_sequence,
                                 bool expert_token_split = false);

// The samples a pipeline trains: every rank puts the rollouts it generated (sample ids
// [first_sample, first_sample + rollouts.size()) of its own block) into `queue`, then one leader
// per model replica (`replica`: the pipeline, or its T x P ranks with TP,
// PipelineGroups::model_parallel; per node of it) fetches the replica's blocks with
// get_range_replicated (one range per run of consecutive blocks) and hands every rank of it the
// same samples, in the replica's rank order. `member_blocks`: the block (in the world's blocks of
// equal size) each rank of the replica generated, in replica-rank order; empty: consecutive ones,
// the replica's rank 0's first. Collective over the world. (The queue carries no reference or
// proximal log-probs: under PP they come from passes over the stages,
// src/app/pipeline_reference.h.)
std::vector<Rollout> pipeline_rollouts(DistQueue& queue, const HierarchicalComm& replica,
                                       const std::vector<Rollout>& own, int group_size,
                                       const std::vector<int>& member_blocks = {});

// StaleSync: the samples a model replica (the pipeline, or its T x P ranks with TP) trains, when
// every rank finished its own varying count of groups: an allgather of the ranks' rollouts
// (packed as DistQueue's, counted on groups.links()) inside the replica, in rank order; `blocks`
// receives each rank's count. Collective over groups.model_parallel().
std::vector<Rollout> gather_replica_rollouts(const PipelineGroups& groups,
                                             const std::vector<Rollout>& own, int group_size,
                                             std::vector<size_t>& blocks);

// Trains a pipeline stage: each minibatch's samples are cut into the pipeline's micro-batches and
// run through the schedule (with EP inside the stage, in step with its EP mates: the same count
// of micro-batches, checked) (run_pipeline_step; with --micro-batch pieces a minibatch may make
// fewer micro-batches than the step's first); the last stage computes the PPO-clip loss from its
// logits, and its statistics are summed over the pipeline. Also what the steps measured.
class PipelineTrainer {
 public:
  // `model`: this rank's stage (layout groups.stage_layout(groups.stage()), with gradients);
  // `rank_samples`: each rank's block of a pipeline's samples, which micro-batches of
  // `micro_batch` cut unless the shape's micro-batch count was given (then equal parts). With
  // `ep` (EP inside the stage, made over groups.data_parallel()), every micro-batch chunk in
  // flight dispatches through dispatchers of its own (RoleExpertParallel::view_dispatchers);
  // `overlap_chunks` > 1 (--ep-overlap-chunks) runs every MoE layer's routed experts in that many
  // chunks whose dispatch and combine overlap the expert FFN (OverlappedExperts of its own per
  // micro-batch chunk in flight); `pairing` (--pipeline-pairing) runs the schedule's forward /
  // backward pairs with their MoE exchanges interleaved (run_pipeline_step).
  PipelineTrainer(const PipelineGroups& groups, Transformer<float>& model,
                  const RlStepSettings& settings, int rank_samples, bool equal_parts,
                  int longest_sequence, RoleExpertParallel* ep = nullptr, int overlap_chunks = 1,
                  bool pairing = false);

  // StaleSync: the step's per-rank block sizes (gather_replica_rollouts), which the next
  // settings.minibatches calls' micro-batches follow instead of equal blocks (each minibatch its
  // share of every block); a pipeline with no samples in a minibatch skips the schedule.
  void set_blocks(std::vector<size_t> blocks) {
    blocks_ = std::move(blocks);
    next_minibatch_ = 0;
  }

  // optimize_on_rollouts' MinibatchGradient for this stage.
  PpoStats minibatch_gradient(const std::vector<const Rollout*>& minibatch, double normalizer,
                              double all_samples);

  // Summed over the steps run so far, on this rank.
  double wall_seconds() const { return wall_seconds_; }
  double wait_seconds() const { return wait_seconds_; }
  double compute_seconds() const { return compute_seconds_; }
  int pairs() const { return pairs_; }  // forward / backward pairs run (pairing)
  // Empty micro-batches run to keep in step with EP mates that had more (StaleSync with EP).
  int padded_micro_batches() const { return padded_micro_batches_; }
  double measured_bubble() const { return wall_seconds_ > 0 ? wait_seconds_ / wall_seconds_ : 0; }
  // The stage's activation arenas (one per micro-batch chunk that was in flight at once) times
  // the largest use of any: a bound of what they held at once, measured.
  size_t activation_bytes_held() const {
    return size_t(stage_.activation_arenas()) * stage_.activation_peak();
  }
  // With EP: the schedule runs' EP communication time and its exposed part (hidden_fraction).
  const SplitPhaseChain::Time& ep_communication() const { return ep_communication_; }

 private:
  // [begin, end) of every micro-batch of minibatch `minibatch`, of `count` samples (the shares of
  // the blocks of the replica's ranks, its rank 0's first).
  std::vector<std::pair<size_t, size_t>> micro_batch_bounds(size_t count, int minibatch) const;

  const PipelineGroups& groups_;
  RlStepSettings settings_;
  bool equal_parts_;
  std::vector<size_t> blocks_;  // StaleSync: each rank's block (empty: equal blocks)
  int next_minibatch_ = 0;      // StaleSync: the minibatch the next call trains
  PipelineStage<float> stage_;
  RoleExpertParallel* ep_;
  bool pairing_;
  int pairs_ = 0;
  int padded_micro_batches_ = 0;
  double wall_seconds_ = 0, wait_seconds_ = 0, compute_seconds_ = 0;
  SplitPhaseChain::Time ep_communication_;
};

}  // namespace rlf
