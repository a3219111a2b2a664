// Gradient reduction for the expert-parallel model (see Transformer::set_expert_parallel).
//
// Rule: a gradient is summed over the ranks that hold the same copy of its parameter and saw
// different tokens. Non-expert tensors are replicated over the EP group (and over its DP
// replicas), so their gradients are summed over all of them. A routed expert lives on one rank
// of each EP group, so its gradient is summed only over its expert-data-parallel group: the
// ranks holding that expert in the DP replicas of the EP group (reduce_expert_gradients); with a
// single EP group that group is the rank alone and expert gradients need no reduction.
#pragma once

#include <cstdint>
#include <vector>

#include "mpi_comm/links.h"
#include "mpi_comm/topology.h"
#include "src/model/parameter_layout.h"

namespace rlf {

// is_expert_tensor, tensor_layer and expert_layers: src/model/parameter_layout.h.

// The experts rank `rank` of a group owns at EP degree `degree` (groups of consecutive ranks):
// [(rank % degree) E / degree, (rank % degree + 1) E / degree).
ExpertShard expert_shard_of(int rank, int degree, int experts);
// The experts both shards hold (count <= 0: none).
ExpertShard shard_overlap(ExpertShard a, ExpertShard b);

// The slices of experts [first, first + count) (global expert ids, within the experts the
// layout stores) in every routed-expert tensor, one range per tensor; with layer >= 0 only in
// that layer's.
std::vector<ParameterRange> expert_slices(const ParameterLayout& layout, int first, int count,
                                          int layer = -1);

// The elements of `ranges` of `data`, one after another; and back.
std::vector<float> pack_ranges(const float* data, const std::vector<ParameterRange>& ranges);
// pack_ranges into a buffer the caller keeps; returns the end of what it wrote.
float* pack_ranges_into(const float* data, const std::vector<ParameterRange>& ranges, float* out);
// The inverse of pack_ranges; returns the end of what it read from `packed`.
const float* unpack_ranges(const float* packed, const std::vector<ParameterRange>& ranges,
                           float* data);
int64_t ranges_size(const std::vector<ParameterRange>& ranges);  // elements in all ranges

// Copies from `src` into `dst` every replicated tensor and every expert slice both layouts store
// (two layouts of the same model that may hold different experts).
void copy_common_parameters(const float* src, const ParameterLayout& src_layout, float* dst,
                            const ParameterLayout& dst_layout);
// Every non-expert tensor, adjacent tensors merged into one range.
std::vector<ParameterRange> replicated_ranges(const ParameterLayout& layout);

// Sums `ranges` of `grads` over `group` (collective; hierarchical allreduces: each range of 64K
// floats or more where it lies, the smaller ones packed into one; nothing to do on a group of one
// rank). Every rank of the group passes ranges of the same sizes in the same order.
void allreduce_ranges(float* grads, const std::vector<ParameterRange>& ranges,
                      const HierarchicalComm& group, Links& links);

// Sums the gradients of every non-expert tensor of `layout` in `grads` over `ep` (collective;
// allreduces as allreduce_ranges makes them, hierarchical or flat ring); expert tensors are left
// untouched.
void allreduce_replicated_gradients(float* grads, const ParameterLayout& layout,
                                    const HierarchicalComm& ep, Links& links,
                                    bool hierarchical = true);

}  // namespace rlf
