#include "src/runtime/pipeline_groups.h"

#include "src/balance/stage_balance.h"
#include "src/runtime/pipeline_step.h"

namespace rlf {

PipelineGroups::PipelineGroups(MPI_Comm comm, const PipelineShape& shape, const ModelConfig& config,
                               Links& links)
    : shape_(shape), config_(config), links_(links) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  validate_pipeline(shape, config.n_layers, size);
  boundaries_ = uniform_boundaries(config.n_layers, shape.chunks());
  stage_ = rank % shape.stages;
  replica_ = rank / shape.stages;
  replicas_ = size / shape.stages;
  MPI_Comm pipeline = MPI_COMM_NULL, data_parallel = MPI_COMM_NULL;
  MPI_Comm_split(comm, replica_, stage_, &pipeline);
  MPI_Comm_split(comm, stage_, replica_, &data_parallel);
  pipeline_ = make_hierarchical(pipeline, links);
  data_parallel_ = make_hierarchical(data_parallel, links);
  MPI_Comm_free(&pipeline);
  MPI_Comm_free(&data_parallel);
}

PipelineGroups::~PipelineGroups() {
  free_hierarchical(data_parallel_);
  free_hierarchical(pipeline_);
}

std::vector<LayerRange> PipelineGroups::chunks(int stage) const {
  return pipeline_rank_chunks(shape_, stage, boundaries_);
}

ParameterLayout PipelineGroups::stage_layout(int stage) const {
  return ParameterLayout(config_, ExpertShard{},
                         stage_layer_shard(chunks(stage), config_.n_layers));
}

OptimizerShard PipelineGroups::optimizer_shard(const ParameterLayout& layout) const {
  OptimizerShard shard;
  shard.owned = {{0, layout.total()}};
  shard.owned_slots = {shard.owned};
  shard.sum_over_group = sum_in_rank_order(pipeline_.comm);
  return shard;
}

}  // namespace rlf
