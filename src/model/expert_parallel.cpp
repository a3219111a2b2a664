#include "src/model/expert_parallel.h"

#include <cstring>
#include <vector>

#include "mpi_comm/hierarchical_collectives.h"

namespace rlf {

namespace {

std::vector<float> pack(const float* data, const std::vector<ParameterRange>& ranges) {
  std::vector<float> packed;
  for (const ParameterRange& r : ranges)
    packed.insert(packed.end(), data + r.offset, data + r.offset + r.count);
  return packed;
}

void unpack(const std::vector<float>& packed, const std::vector<ParameterRange>& ranges,
            float* data) {
  size_t at = 0;
  for (const ParameterRange& r : ranges) {
    std::memcpy(data + r.offset, packed.data() + at, size_t(r.count) * sizeof(float));
    at += size_t(r.count);
  }
}

}  // namespace

bool is_expert_tensor(const ParameterTensor& tensor) {
  return tensor.name.find(".experts.") != std::string::npos;
}

std::vector<ParameterRange> expert_slices(const ParameterLayout& layout, int experts, int first,
                                          int count) {
  std::vector<ParameterRange> ranges;
  for (const ParameterTensor& t : layout.tensors()) {
    if (!is_expert_tensor(t)) continue;
    const int64_t per_expert = t.numel / experts;
    ranges.push_back({t.offset + per_expert * first, per_expert * count});
  }
  return ranges;
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

void allreduce_ranges(float* grads, const std::vector<ParameterRange>& ranges,
                      const HierarchicalComm& group, Links& links) {
  if (group.size() < 2) return;
  // Packed so the reduction is one collective over only the bytes that need it.
  std::vector<float> packed = pack(grads, ranges);
  allreduce_sum(packed.data(), int64_t(packed.size()), group, links);
  unpack(packed, ranges, grads);
}

void allreduce_replicated_gradients(float* grads, const ParameterLayout& layout,
                                    const HierarchicalComm& ep, Links& links, bool hierarchical) {
  const std::vector<ParameterRange> ranges = replicated_ranges(layout);
  std::vector<float> packed = pack(grads, ranges);
  if (hierarchical) {
    allreduce_sum(packed.data(), int64_t(packed.size()), ep, links);
  } else {
    flat_allreduce_sum(packed.data(), int64_t(packed.size()), ep, links);
  }
  unpack(packed, ranges, grads);
}

}  // namespace rlf
