// Tensor parallelism together with expert parallelism (train --mode fused --tensor-parallel T
// --expert-parallel E): the EP groups are the ranks with the same TP rank in E consecutive TP
// groups (E consecutive ranks of TensorParallel::data_parallel()), so every TP rank of a group
// routes the group's tokens over its own EP group, and every routed expert is held, and computed
// on the same tokens, by the T ranks of one TP group: bit-identical copies, nothing to reduce over
// TP. Attention (and the shared expert unless on attention only) stays TP-sliced.
#pragma once

#include "src/model/optimizer.h"
#include "src/model/parameter_layout.h"
#include "src/model/tensor_parallel.h"
#include "src/runtime/role_expert_parallel.h"

namespace rlf {

// The AdamW shard of a TP x EP rank: it updates everything it stores (its TP slices, its copy of
// the whole dense tensors, its experts), and the clipping norm counts every element of the model
// once: the experts summed over the EP group by expert id (the same bits on every TP rank, whose
// copies are identical), plus, summed over the TP group in TP-rank order, the whole dense tensors
// on TP rank 0 and every TP rank's cut tensors. The same norm on every rank. `ep` must be made
// over tp.data_parallel() and outlive the shard.
OptimizerShard tensor_expert_optimizer_shard(const ParameterLayout& layout,
                                             const TensorParallel& tp,
                                             const RoleExpertParallel& ep);

// The whole model from a TP x EP run's parts (what train evaluates and saves): each TP rank's EP
// group of the first EP replica gathers its experts onto its EP rank 0 (collective over that EP
// group: the ranks of the first TP group receive), then the first TP group assembles the slices
// (collective over it). Returns true on the ranks of the first TP group, which then hold the
// whole model in `whole` (laid out by `whole_layout`: every layer and expert, no slice) when it
// is not null; the other ranks return false after sending their experts (or at once).
bool gather_tensor_expert_parallel(const float* params, const ParameterLayout& layout, float* whole,
                                   const ParameterLayout& whole_layout, const ModelConfig& config,
                                   const TensorParallel& tp, RoleExpertParallel& ep);

}  // namespace rlf
