#include "src/runtime/tensor_expert_parallel.h"

#include <utility>
#include <vector>

#include "src/model/expert_parallel.h"

namespace rlf {

OptimizerShard tensor_expert_optimizer_shard(const ParameterLayout& layout,
                                             const TensorParallel& tp,
                                             const RoleExpertParallel& ep) {
  // The EP shard's replicated tensors are this rank's dense ones, cut or whole: they become two
  // norm slots ahead of the experts' (whole dense, then cut), so only the experts' go through the
  // EP group's sum.
  OptimizerShard shard = ep.optimizer_shard(layout);
  const std::vector<ParameterRange> whole = tensor_replicated_dense_ranges(layout);
  const std::vector<ParameterRange> cut = tensor_parallel_ranges(layout);
  shard.replicated.clear();
  shard.owned.insert(shard.owned.begin(), cut.begin(), cut.end());
  shard.owned.insert(shard.owned.begin(), whole.begin(), whole.end());
  shard.owned_slots.insert(shard.owned_slots.begin(), {whole, cut});
  const auto experts = std::move(shard.sum_over_group);
  const auto over_tp = sum_in_rank_order(tp.group().comm);
  const bool counts_whole = tp.rank() == 0;
  shard.sum_over_group = [experts, over_tp, counts_whole](const std::vector<double>& per_slot) {
    const double every_expert = experts(std::vector<double>(per_slot.begin() + 2, per_slot.end()));
    return every_expert + over_tp({(counts_whole ? per_slot[0] : 0.0) + per_slot[1]});
  };
  return shard;
}

uint64_t sum_expert_gradients_over_tensor_group(float* grads, const ParameterLayout& layout,
                                                const TensorParallel& tp) {
  const auto sent = [&tp] {
    const LinkCounters& c = tp.links().counters();
    return c.bytes[0] + c.bytes[1];
  };
  const uint64_t before = sent();
  // Every row the layout stores: the rank's experts and, with replicas, its spare slots.
  allreduce_ranges(grads, expert_slices(layout, layout.first_expert(), layout.stored_experts()),
                   tp.group(), tp.links());
  return sent() - before;
}

uint64_t reduce_tensor_expert_gradients(float* grads, const ParameterLayout& layout,
                                        const TensorParallel& tp, RoleExpertParallel& ep) {
  const uint64_t over_tp = sum_expert_gradients_over_tensor_group(grads, layout, tp);
  return over_tp + ep.reduce_gradients(grads, layout);
}

bool gather_tensor_expert_parallel(const float* params, const ParameterLayout& layout, float* whole,
                                   const ParameterLayout& whole_layout, const ModelConfig& config,
                                   const TensorParallel& tp, RoleExpertParallel& ep) {
  // This rank's slice with every expert: the first TP group's ranks are EP rank 0 of the first
  // EP replica of their EP groups.
  const ParameterLayout every_expert(config, ExpertShard{}, layout.layer_shard(), tp.slice());
  std::vector<float> sliced(size_t(every_expert.total()), 0.0f);
  ep.gather_full_model(params, layout, sliced.data(), every_expert);
  if (tp.replica() != 0) return false;
  std::vector<float> own(whole ? 0 : size_t(whole_layout.total()));
  gather_tensor_parallel(sliced.data(), every_expert, whole ? whole : own.data(), whole_layout,
                         config, tp);
  return true;
}

}  // namespace rlf
