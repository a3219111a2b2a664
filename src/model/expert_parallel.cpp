#include "src/model/expert_parallel.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpi_comm/hierarchical_collectives.h"

namespace rlf {

std::vector<float> pack_ranges(const float* data, const std::vector<ParameterRange>& ranges) {
  std::vector<float> packed(size_t(ranges_size(ranges)));
  pack_ranges_into(data, ranges, packed.data());
  return packed;
}

float* pack_ranges_into(const float* data, const std::vector<ParameterRange>& ranges, float* out) {
  for (const ParameterRange& r : ranges) {
    std::memcpy(out, data + r.offset, size_t(r.count) * sizeof(float));
    out += r.count;
  }
  return out;
}

const float* unpack_ranges(const float* packed, const std::vector<ParameterRange>& ranges,
                           float* data) {
  for (const ParameterRange& r : ranges) {
    std::memcpy(data + r.offset, packed, size_t(r.count) * sizeof(float));
    packed += r.count;
  }
  return packed;
}

int64_t ranges_size(const std::vector<ParameterRange>& ranges) {
  int64_t n = 0;
  for (const ParameterRange& r : ranges) n += r.count;
  return n;
}

ExpertShard expert_shard_of(int rank, int degree, int experts) {
  const int local = experts / degree;
  return {(rank % degree) * local, local};
}

ExpertShard shard_overlap(ExpertShard a, ExpertShard b) {
  const int first = std::max(a.first, b.first);
  return {first, std::min(a.first + a.count, b.first + b.count) - first};
}

std::vector<ParameterRange> expert_slices(const ParameterLayout& layout, int first, int count,
                                          int layer) {
  if (first < layout.first_expert() ||
      first + count > layout.first_expert() + layout.stored_experts()) {
    throw std::invalid_argument("expert_slices: experts outside the ones the layout stores");
  }
  std::vector<ParameterRange> ranges;
  for (const ParameterTensor& t : layout.tensors()) {
    if (!is_expert_tensor(t) || (layer >= 0 && tensor_layer(t) != layer)) continue;
    const int64_t per_expert = t.numel / t.shape[0];
    ranges.push_back({t.offset + per_expert * (first - layout.first_expert()), per_expert * count});
  }
  return ranges;
}

void copy_common_parameters(const float* src, const ParameterLayout& src_layout, float* dst,
                            const ParameterLayout& dst_layout) {
  const auto& from_tensors = src_layout.tensors();
  const auto& to_tensors = dst_layout.tensors();
  if (from_tensors.size() != to_tensors.size()) {
    throw std::invalid_argument("copy_common_parameters: layouts of different models");
  }
  for (size_t i = 0; i < from_tensors.size(); ++i) {
    if (is_expert_tensor(from_tensors[i])) continue;
    std::memcpy(dst + to_tensors[i].offset, src + from_tensors[i].offset,
                size_t(from_tensors[i].numel) * sizeof(float));
  }
  // By expert id: a layout with redundant slots holds its own experts in its first rows (its spare
  // slots are filled by RoleExpertParallel::fill_redundant_slots).
  const ExpertShard src_own = src_layout.own_experts(), dst_own = dst_layout.own_experts();
  const int first = std::max(src_own.first, dst_own.first);
  const int end = std::min(src_own.first + src_own.count, dst_own.first + dst_own.count);
  if (end <= first) return;
  const std::vector<ParameterRange> from =
      expert_slices(src_layout, src_layout.first_expert() + first - src_own.first, end - first);
  const std::vector<ParameterRange> to =
      expert_slices(dst_layout, dst_layout.first_expert() + first - dst_own.first, end - first);
  for (size_t i = 0; i < from.size(); ++i)
    std::memcpy(dst + to[i].offset, src + from[i].offset, size_t(from[i].count) * sizeof(float));
}

std::vector<ParameterRange> replicated_ranges(const ParameterLayout& layout) {
  std::vector<ParameterRange> ranges;
  for (const ParameterTensor& t : layout.tensors()) {
    if (is_expert_tensor(t)) continue;
    if (!ranges.empty() && ranges.back().offset + ranges.back().count == t.offset) {
      ranges.back().count += t.numel;
    } else {
      ranges.push_back({t.offset, t.numel});
    }
  }
  return ranges;
}

namespace {

// Ranges of at least this many floats (256 KiB) are reduced where they lie: one more collective
// costs little next to their bytes, while packing them would copy them twice into a fresh buffer
// whose every page is first-touched on each call (about 9 us a page on the VMs measured: a
// 200 MB pack took 0.6-0.9 s, the allreduce itself 0.28 s). The smaller ones are packed into one
// collective. The ranks of a group pass ranges of the same sizes in the same order (the same
// tensors or expert blocks), so they make the same collectives.
constexpr int64_t kReduceInPlaceFloats = int64_t(1) << 16;

template <typename Reduce>
void reduce_ranges(float* grads, const std::vector<ParameterRange>& ranges, Reduce reduce) {
  std::vector<ParameterRange> small;
  for (const ParameterRange& r : ranges) {
    if (r.count >= kReduceInPlaceFloats) {
      reduce(grads + r.offset, r.count);
    } else {
      small.push_back(r);
    }
  }
  if (small.empty()) return;
  std::vector<float> packed = pack_ranges(grads, small);
  reduce(packed.data(), int64_t(packed.size()));
  unpack_ranges(packed.data(), small, grads);
}

}  // namespace

void allreduce_ranges(float* grads, const std::vector<ParameterRange>& ranges,
                      const HierarchicalComm& group, Links& links) {
  if (group.size() < 2) return;
  reduce_ranges(grads, ranges,
                [&](float* data, int64_t count) { allreduce_sum(data, count, group, links); });
}

void allreduce_replicated_gradients(float* grads, const ParameterLayout& layout,
                                    const HierarchicalComm& ep, Links& links, bool hierarchical) {
  reduce_ranges(grads, replicated_ranges(layout), [&](float* data, int64_t count) {
    if (hierarchical) {
      allreduce_sum(data, count, ep, links);
    } else {
      flat_allreduce_sum(data, count, ep, links);
    }
  });
}

}  // namespace rlf
