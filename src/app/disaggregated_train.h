// `rlfusion train` on more than one rank: synchronous disaggregated RL. Actors generate and score
// with policy version v and put the samples into DistQueue; learners take the step's batch
// (hierarchically: one request per node), train data-parallel with a hierarchical gradient
// allreduce, and learner 0 sends version v + 1 to the actors by a bucketed hierarchical
// broadcast. Dedicated queue ranks only serve shards. With --expert-parallel the learners (and
// with --actor-expert-parallel the actors) shard the routed experts over EP groups of
// consecutive role ranks (src/runtime/role_expert_parallel.h).
#pragma once

#include <string>

#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/topology.h"
#include "src/app/policy_setup.h"
#include "src/app/rl_options.h"
#include "src/app/sft_phase.h"
#include "src/app/train_checkpoints.h"
#include "src/app/train_rebalance.h"
#include "src/app/train_result.h"

namespace rlf {

struct DisaggregatedOptions {
  bool hierarchical_queue = true;  // --queue-transfer hierarchical | flat
  int64_t shard_capacity = 4096;   // --queue-capacity, samples per shard
  int expert_parallel = 1;         // --expert-parallel: EP degree of the learners
  int actor_expert_parallel = 0;   // --actor-expert-parallel (0: the learners' degree)
  DispatchMode ep_dispatch = DispatchMode::Hierarchical;  // --ep-dispatch
  int ep_overlap_chunks = 1;  // --ep-overlap-chunks: training's routed experts in chunks
  // --pipeline-pairing (PP x EP): each forward next to a backward in the schedule runs with it as
  // a pair, their MoE exchanges interleaved (src/model/pass_pair.h).
  bool pipeline_pairing = false;
  bool offload = false;  // --offload (fused): training state to host during generation
  // --tensor-parallel (fused): TP groups of this many consecutive ranks each hold one replica
  // of the model (src/model/tensor_parallel.h); --tensor-parallel-attention-only.
  int tensor_parallel = 1;
  bool tensor_parallel_attention_only = false;
  // --tensor-parallel-duplicate-experts (TP x EP): every TP rank dispatches all of its group's
  // tokens (each expert's work done T times) instead of its share (the token split, default).
  bool tensor_parallel_duplicate_experts = false;
  // --actor-tensor-parallel (fused): the generation layout's TP degree (0: --tensor-parallel
  // without a pipeline, 1 with one; generation_tensor_parallel resolves it).
  int actor_tensor_parallel = 0;
  // --pipeline-parallel (fused): pipelines of this many consecutive ranks train one replica of
  // the model, stage by stage (src/app/pipeline_parallel_train.h); --virtual-stages per rank;
  // --micro-batches per pipeline and step (0: every rank's samples in --micro-batch pieces).
  int pipeline_parallel = 1;
  int virtual_stages = 1;
  int micro_batches = 0;
  // --actor-pipeline-parallel (fused, with --pipeline-parallel P): 1 (default) generates
  // data-parallel, each rank borrowing the other stages' layers; P generates inside the
  // training pipelines, each stage from its own layers (src/runtime/pipeline_generation.h).
  int actor_pipeline_parallel = 1;
  // --pipeline-balance: layers per chunk, uniform | counted | measured | a list
  // (pipeline_balance.h)
  std::string pipeline_balance = "uniform";
  RebalanceOptions rebalance;  // --rebalance-* and --router-skew (EDPB)
  // --reorder-samples off | counted | measured: data reordering (src/app/sample_reordering.h)
  std::string reorder_samples = "off";
};

int run_disaggregated_train(const RunOptions& run, const PolicyOptions& policy_options,
                            const SftSchedule& sft, const RlOptions& rl, const LayoutConfig& layout,
                            const DisaggregatedOptions& options, const std::string& resolved_config,
                            TrainResult* result = nullptr,
                            const CheckpointOptions& checkpoints = {});

}  // namespace rlf
