#include "src/runtime/pipeline_groups.h"

#include <string>
#include <utility>

#include "kernels/error.h"
#include "src/balance/stage_balance.h"
#include "src/model/expert_parallel.h"
#include "src/runtime/pipeline_step.h"
#include "src/runtime/role_expert_parallel.h"
#include "src/runtime/tensor_expert_parallel.h"

namespace rlf {

PipelineGroups::PipelineGroups(MPI_Comm comm, const PipelineShape& shape, const ModelConfig& config,
                               Links& links, const TensorParallel* tp, int expert_parallel,
                               std::vector<int> boundaries, int redundant_slots)
    : shape_(shape), config_(config), boundaries_(std::move(boundaries)), tp_(tp), links_(links) {
  // With TP the stages of a pipeline are TP replicas with the same TP rank.
  const MPI_Comm replicas = tp ? tp->data_parallel().comm : comm;
  int size = 0;
  MPI_Comm_size(replicas, &size);
  validate_pipeline(shape, config.n_layers, size, /*balanced=*/!boundaries_.empty());
  if (boundaries_.empty()) {
    boundaries_ = uniform_boundaries(config.n_layers, shape.chunks());
  } else {
    validate_chunk_boundaries(boundaries_, shape, config.n_layers);
  }
  if (expert_parallel > 1) {
    const std::string option = "--expert-parallel " + std::to_string(expert_parallel);
    const int pipelines = size / shape.stages;
    if (pipelines % expert_parallel != 0 || config.n_experts % expert_parallel != 0) {
      throw ConfigError(option + " with --pipeline-parallel " + std::to_string(shape.stages) +
                        " must divide both the " + std::to_string(pipelines) +
                        " pipelines (the ranks of a stage) and the model's " +
                        std::to_string(config.n_experts) + " experts");
    }
  }
  groups_ = split_consecutive_groups(replicas, shape.stages, links);
  if (expert_parallel > 1) {
    experts_ = expert_shard_of(groups_.group, expert_parallel, config.n_experts);
    experts_.redundant = redundant_slots;
  }
  if (tp) model_parallel_ = split_consecutive_groups(comm, tp->degree() * shape.stages, links);
  // With TP one stage-major order per TP rank (the ranks of that TP rank), where E consecutive
  // ranks are again one EP group of that TP rank and stage.
  MPI_Comm ordered = MPI_COMM_NULL;
  MPI_Comm_split(comm, tp ? tp->rank() : 0, groups_.place * groups_.groups + groups_.group,
                 &ordered);
  stage_major_ = make_hierarchical(ordered, links);  // (a duplicate of `ordered`)
  MPI_Comm_free(&ordered);
}

PipelineGroups::~PipelineGroups() {
  if (tp_) free_consecutive_groups(model_parallel_);
  free_hierarchical(stage_major_);
  free_consecutive_groups(groups_);
}

std::vector<LayerRange> PipelineGroups::chunks(int stage) const {
  return pipeline_rank_chunks(shape_, stage, boundaries_);
}

ParameterLayout PipelineGroups::stage_layout(int stage, ExpertShard experts) const {
  return ParameterLayout(config_, experts, stage_layer_shard(chunks(stage), config_.n_layers));
}

OptimizerShard PipelineGroups::optimizer_shard(const ParameterLayout& layout,
                                               const RoleExpertParallel* ep) const {
  if (ep) return expert_parallel_optimizer_shard(layout, *ep);
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

OptimizerShard PipelineGroups::expert_parallel_optimizer_shard(const ParameterLayout& layout,
                                                               const RoleExpertParallel& ep) const {
  if (tp_) {
    // TP x EP x PP: the stage's squared norm as at TP x EP (experts over the EP group, the whole
    // dense tensors on TP rank 0 and every rank's cut ones over the TP group; the same on every
    // rank of the stage), then summed over the pipeline in stage order.
    OptimizerShard shard = tensor_expert_optimizer_shard(layout, *tp_, ep);
    const auto stage_norm = std::move(shard.sum_over_group);
    const auto over_pipeline = sum_in_rank_order(pipeline().comm);
    shard.sum_over_group = [stage_norm, over_pipeline](const std::vector<double>& per_slot) {
      return over_pipeline({stage_norm(per_slot)});
    };
    return shard;
  }
  // The EP shard counts the stage's experts over the EP group; its replicated (dense) tensors
  // become the first norm slot, so that the stage's whole squared norm is summed over the
  // pipeline.
  OptimizerShard shard = ep.optimizer_shard(layout);
  const std::vector<ParameterRange> dense = std::move(shard.replicated);
  shard.replicated.clear();
  shard.owned.insert(shard.owned.begin(), dense.begin(), dense.end());
  shard.owned_slots.insert(shard.owned_slots.begin(), dense);
  const auto stage_experts = shard.sum_over_group;
  const auto over_pipeline = sum_in_rank_order(pipeline().comm);
  shard.sum_over_group = [stage_experts, over_pipeline](const std::vector<double>& per_slot) {
    const double stage =
        per_slot.front() + stage_experts(std::vector<double>(per_slot.begin() + 1, per_slot.end()));
    return over_pipeline({stage});
  };
  return shard;
}

}  // namespace rlf
