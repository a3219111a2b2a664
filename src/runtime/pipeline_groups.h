// The ranks of a pipeline-parallel model: pipelines of p consecutive ranks (one per stage, in
// stage order) and data-parallel groups across them (the ranks holding the same stage, one per
// pipeline), which layers each stage holds, and AdamW over a stage (the clipping norm over the
// whole pipeline).
//
// With tensor parallelism inside every stage (TP x PP), rank r of the communicator is TP rank
// r % T of stage (r / T) % p of replica r / (T p): TP innermost (a TP group is T consecutive
// ranks), then the pipeline, then data parallelism. A pipeline is then the p ranks with the same TP
// rank and replica (activations go between matching TP ranks of consecutive stages: every TP rank
// holds the whole hidden rows), and the model-parallel group, T p consecutive ranks, holds one
// replica of the model.
//
// With expert parallelism inside every stage (PP x EP), the EP groups are E consecutive replicas
// of a stage's data-parallel group: every rank of pipeline r stores the experts of EP rank r % E
// (and the E p consecutive ranks of E pipelines hold one replica of the model). With TP too
// (TP x EP x PP), the pipelines are those of each TP rank, so an EP group is the ranks with the
// same TP rank and stage in E consecutive model replicas, and every TP rank of a stage stores the
// same experts (the TP x EP layout inside every stage, src/runtime/tensor_expert_parallel.h).
#pragma once

#include <mpi.h>

#include <vector>

#include "mpi_comm/topology.h"
#include "src/model/optimizer.h"
#include "src/model/parameter_layout.h"
#include "src/model/pipeline_stage.h"
#include "src/model/tensor_parallel.h"
#include "src/runtime/pipeline_schedule.h"

namespace rlf {

class RoleExpertParallel;

class PipelineGroups {
 public:
  // Collective over `comm`: splits it into pipelines of shape.stages consecutive ranks and the
  // data-parallel groups across them. The layers are cut into shape.chunks() chunks at
  // `boundaries` (p v + 1 layer indices, virtual stage s holding [boundaries[s],
  // boundaries[s + 1]), e.g. from stage balancing), or with none into equal chunks (virtual stage s
  // holds layers [s L / (p v), (s + 1) L / (p v))). Throws ConfigError on every rank
  // (validate_pipeline, validate_chunk_boundaries) when the shape or the boundaries do not fit the
  // model's layers or the ranks of `comm`.
  // `links` (not owned) counts every message. With `tp` (not owned; its TP groups cut `comm` into
  // T consecutive ranks), the pipelines cut its replicas (tp->data_parallel(), T p consecutive
  // ranks of `comm` per pipeline replica) and the shape must fit size(comm) / T. With
  // `expert_parallel` E > 1 every stage stores only its EP rank's experts; E must divide the
  // pipelines (with `tp`, of each TP rank) and the experts (ConfigError on every rank); with
  // `redundant_slots` R (--redundant-experts) it stores them in E / degree + R slots, the last R
  // spare ones for replicas (ExpertShard::redundant).
  PipelineGroups(MPI_Comm comm, const PipelineShape& shape, const ModelConfig& config, Links& links,
                 const TensorParallel* tp = nullptr, int expert_parallel = 1,
                 std::vector<int> boundaries = {}, int redundant_slots = 0);
  ~PipelineGroups();
  PipelineGroups(const PipelineGroups&) = delete;
  PipelineGroups& operator=(const PipelineGroups&) = delete;

  const PipelineShape& shape() const { return shape_; }
  const ModelConfig& config() const { return config_; }
  int stage() const { return groups_.place; }  // this rank's place in its pipeline
  int replica() const { return groups_.group; }
  int replicas() const { return groups_.groups; }
  // This rank's pipeline (rank = stage) and its data-parallel group (rank = replica).
  const HierarchicalComm& pipeline() const { return groups_.members; }
  const HierarchicalComm& data_parallel() const { return groups_.across; }
  Links& links() const { return links_; }
  // The TP group inside this rank's stage (null without TP).
  const TensorParallel* tensor_parallel() const { return tp_; }
  // The ranks holding one replica of the model: the pipeline, or with TP the T p ranks of its TP
  // groups (rank = TP rank + T stage); every one of them trains the same samples.
  const HierarchicalComm& model_parallel() const {
    return tp_ ? model_parallel_.members : groups_.members;
  }

  // Every rank of the pipelines in stage-major order (stage 0's ranks in pipeline order, then
  // stage 1's, ...; with TP, of this rank's TP rank only), where E consecutive ranks are one
  // stage's EP group (EP rank = place): the order a layout switch from PP x EP to a generation EP
  // degree of its own (ExpertLayoutSwitch) and the generation EP groups take.
  const HierarchicalComm& stage_major() const { return stage_major_; }

  // The chunk boundaries: p v + 1 layer indices, virtual stage s holding [b[s], b[s + 1]).
  const std::vector<int>& boundaries() const { return boundaries_; }
  // The chunks stage `stage` runs, in its local order, and the layout that stores them (whole
  // tensors: with TP each rank stores its slice of it, ParameterLayout's TensorSlice; with EP
  // this pipeline's experts, or the given ones).
  std::vector<LayerRange> chunks(int stage) const;
  ParameterLayout stage_layout(int stage) const { return stage_layout(stage, experts_); }
  ParameterLayout stage_layout(int stage, ExpertShard experts) const;
  // The experts every stage of this pipeline stores (all of them without EP), and the layout of
  // every layer with them: what the layout switch assembles for generation.
  ExpertShard expert_shard() const { return experts_; }
  ParameterLayout generation_layout() const { return ParameterLayout(config_, experts_); }

  // AdamW over this rank's stage: every parameter it stores is its own, and the clipping norm
  // sums the stages' squared norms over the pipeline in stage order, so it counts every parameter
  // of the model once and is bit-identical on every stage (and, the stages' gradients being
  // summed over the data-parallel groups first, on every pipeline). With TP the whole tensors of a
  // stage (the same on its TP ranks) count on TP rank 0 only and the cut ones on every TP rank,
  // summed over the model-parallel group in rank order. With `ep` (EP inside the stages, made over
  // data_parallel()), AdamW updates the stage's dense tensors and this rank's experts; the stage's
  // squared norm adds the dense tensors (the same on its EP ranks) to every expert of the stage
  // once (summed over the EP group), and the stages' norms are summed over the pipeline. With TP
  // and `ep` the stage's norm is TP x EP's (tensor_expert_optimizer_shard).
  OptimizerShard optimizer_shard(const ParameterLayout& layout,
                                 const RoleExpertParallel* ep = nullptr) const;

 private:
  OptimizerShard expert_parallel_optimizer_shard(const ParameterLayout& layout,
                                                 const RoleExpertParallel& ep) const;

  PipelineShape shape_;
  ModelConfig config_;
  std::vector<int> boundaries_;
  const TensorParallel* tp_ = nullptr;
  ExpertShard experts_;
  ConsecutiveGroups groups_;          // pipelines (members) and data parallelism (across)
  ConsecutiveGroups model_parallel_;  // with TP: the T p ranks of a replica (members)
  HierarchicalComm stage_major_;      // every rank (with TP, of this TP rank), stage by stage
  Links& links_;
};

}  // namespace rlf
