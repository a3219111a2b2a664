// Tensor parallelism together with expert parallelism (train --mode fused --tensor-parallel T
// --expert-parallel E): the EP groups are the ranks with the same TP rank in E consecutive TP
// groups (E consecutive ranks of TensorParallel::data_parallel()), so every routed expert is held
// by the T ranks of one TP group. With the token split (the default, Transformer::
// set_expert_token_split) each TP rank dispatches only its share of the group's tokens over its EP
// group, so the T copies of an expert see different tokens and their gradients are summed over
// the TP group (reduce_tensor_expert_gradients); we sum rather than shard the experts over the TP
// ranks so that storage, checkpoints, AdamW and generation stay those of TP x EP without the split
// (the copies stay bit-identical). Without it (--tensor-parallel-duplicate-experts) every TP rank
// routes all of the group's tokens: bit-identical copies computed T times, nothing to reduce over
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

// The token split's expert gradients (with or without EP): each routed expert row this rank
// stores (its experts and spare slots) summed over the TP group, whose T copies saw different
// rows; every copy ends bit-identical. Collective over the TP group; returns the bytes this rank
// sent.
uint64_t sum_expert_gradients_over_tensor_group(float* grads, const ParameterLayout& layout,
                                                const TensorParallel& tp);

// Gradient reduction at TP x EP with the token split: each routed expert's gradient summed over
// the TP group (its T copies saw different rows), then RoleExpertParallel::reduce_gradients (dense
// tensors over the data-parallel group, experts over their expert-data-parallel group). Every copy
// ends bit-identical. Collective over the TP group and ep's role; returns the bytes this rank sent.
uint64_t reduce_tensor_expert_gradients(float* grads, const ParameterLayout& layout,
                                        const TensorParallel& tp, RoleExpertParallel& ep);

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
