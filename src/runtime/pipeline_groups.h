// The ranks of a pipeline-parallel model: pipelines of p consecutive ranks (one per stage, in
// stage order) and data-parallel groups across them (the ranks holding the same stage, one per
// pipeline), which layers each stage holds, and AdamW over a stage (the clipping norm over the
// whole pipeline).
#pragma once

#include <mpi.h>

#include <vector>

#include "mpi_comm/topology.h"
#include "src/model/optimizer.h"
#include "src/model/parameter_layout.h"
#include "src/model/pipeline_stage.h"
#include "src/runtime/pipeline_schedule.h"

namespace rlf {

class PipelineGroups {
 public:
  // Collective over `comm`: splits it into pipelines of shape.stages consecutive ranks and the
  // data-parallel groups across them. The layers are cut into shape.chunks() equal chunks (virtual
  // stage s holds layers [s L / (p v), (s + 1) L / (p v))). Throws ConfigError on every rank
  // (validate_pipeline) when the shape does not fit the model's layers or the ranks of `comm`.
  // `links` (not owned) counts every message.
  PipelineGroups(MPI_Comm comm, const PipelineShape& shape, const ModelConfig& config,
                 Links& links);
  ~PipelineGroups();
  PipelineGroups(const PipelineGroups&) = delete;
  PipelineGroups& operator=(const PipelineGroups&) = delete;

  const PipelineShape& shape() const { return shape_; }
  int stage() const { return stage_; }  // this rank's place in its pipeline
  int replica() const { return replica_; }
  int replicas() const { return replicas_; }
  // This rank's pipeline (rank = stage) and its data-parallel group (rank = replica).
  const HierarchicalComm& pipeline() const { return pipeline_; }
  const HierarchicalComm& data_parallel() const { return data_parallel_; }
  Links& links() const { return links_; }

  // The chunks stage `stage` runs, in its local order, and the layout that stores them.
  std::vector<LayerRange> chunks(int stage) const;
  ParameterLayout stage_layout(int stage) const;

  // AdamW over this rank's stage: every parameter it stores is its own, and the clipping norm
  // sums the stages' squared norms over the pipeline in stage order, so it counts every parameter
  // of the model once and is bit-identical on every stage (and, the stages' gradients being
  // summed over the data-parallel groups first, on every pipeline).
  OptimizerShard optimizer_shard(const ParameterLayout& layout) const;

 private:
  PipelineShape shape_;
  ModelConfig config_;
  std::vector<int> boundaries_;
  int stage_ = 0, replica_ = 0, replicas_ = 1;
  HierarchicalComm pipeline_, data_parallel_;
  Links& links_;
};

}  // namespace rlf
