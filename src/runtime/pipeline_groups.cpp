#include "src/runtime/pipeline_groups.h"

#include "src/balance/stage_balance.h"
#include "src/runtime/pipeline_step.h"

namespace rlf {

PipelineGroups::PipelineGroups(MPI_Comm comm, const PipelineShape& shape, const ModelConfig& config,
                               Links& links, const TensorParallel* tp)
    : shape_(shape), config_(config), tp_(tp), links_(links) {
  // With TP the stages of a pipeline are TP replicas with the same TP rank.
  const MPI_Comm replicas = tp ? tp->data_parallel().comm : comm;
  int size = 0;
  MPI_Comm_size(replicas, &size);
  validate_pipeline(shape, config.n_layers, size);
  boundaries_ = uniform_boundaries(config.n_layers, shape.chunks());
  groups_ = split_consecutive_groups(replicas, shape.stages, links);
  if (tp) model_parallel_ = split_consecutive_groups(comm, tp->degree() * shape.stages, links);
}

PipelineGroups::~PipelineGroups() {
  if (tp_) free_consecutive_groups(model_parallel_);
  free_consecutive_groups(groups_);
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
  if (!tp_) {
    shard.owned_slots = {shard.owned};
    shard.sum_over_group = sum_in_rank_order(pipeline().comm);
    return shard;
  }
  // Two slots for the norm only: the stage's whole tensors (bit-identical on its TP ranks: counted
  // by TP rank 0) and its cut tensors (each TP rank its own slice).
  shard.owned_slots = {tensor_replicated_ranges(layout), tensor_parallel_ranges(layout)};
  const auto sum = sum_in_rank_order(model_parallel().comm);
  const bool counts_whole = tp_->rank() == 0;
  shard.sum_over_group = [sum, counts_whole](const std::vector<double>& per_slot) {
    return sum({(counts_whole ? per_slot[0] : 0.0) + per_slot[1]});
  };
  return shard;
}

}  // namespace rlf
