#include "src/model/tensor_parallel.h"

#include <cstring>
#include <stdexcept>

#include "kernels/error.h"
#include "mpi_comm/hierarchical_collectives.h"
#include "src/model/optimizer.h"

namespace rlf {

std::string tensor_parallel_problem(const ModelConfig& config, int degree, bool attention_only,
                                    int ranks) {
  const std::string model = config.name.empty() ? "the model" : "model " + config.name;
  if (degree < 1) return "must be a positive integer";
  if (ranks % degree != 0) {
    return "does not divide the " + std::to_string(ranks) +
           " ranks it is made of (each tensor-parallel group needs " + std::to_string(degree) +
           " ranks)";
  }
  if (config.n_heads % degree != 0) {
    return "does not divide the " + std::to_string(config.n_heads) + " attention heads of " +
           model + " (n_heads; d_model = " + std::to_string(config.d_model) + ")";
  }
  if (!attention_only && config.shared_expert_d_ff % degree != 0) {
    return "does not divide the shared expert's hidden width " +
           std::to_string(config.shared_expert_d_ff) + " of " + model +
           " (shared_expert_d_ff; tensor parallelism on attention only leaves it whole)";
  }
  return {};
}

void validate_tensor_parallel(const ModelConfig& config, int degree, bool attention_only, int ranks,
                              const std::string& option) {
  const std::string problem = tensor_parallel_problem(config, degree, attention_only, ranks);
  if (!problem.empty()) throw ConfigError(option + " " + std::to_string(degree) + ": " + problem);
}

TensorParallel::TensorParallel(MPI_Comm comm, int degree, bool attention_only,
                               const ModelConfig& config, Links& links)
    : links_(links) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  validate_tensor_parallel(config, degree, attention_only, size);
  groups_ = split_consecutive_groups(comm, degree, links);
  slice_ = {groups_.place, degree, attention_only};
}

TensorParallel::~TensorParallel() {
  free_consecutive_groups(groups_);
}

void TensorParallel::allreduce_sum(float* data, int64_t count) const {
  counters_.allreduces += 1;
  counters_.allreduced_elements += count;
  if (slice_.size > 1) flat_allreduce_sum(data, count, groups_.members, links_);
}

void TensorParallel::allreduce_sum(double*, int64_t) const {
  throw std::logic_error("tensor parallelism needs float parameters");
}

OptimizerShard TensorParallel::optimizer_shard(const ParameterLayout& layout) const {
  OptimizerShard shard;
  shard.replicated = tensor_replicated_ranges(layout);
  shard.owned = tensor_parallel_ranges(layout);
  shard.owned_slots = {shard.owned};
  shard.sum_over_group = sum_in_rank_order(groups_.members.comm);
  return shard;
}

ParameterLayout with_tensor_slice(const ModelConfig& config, const ParameterLayout& like,
                                  TensorSlice slice) {
  return ParameterLayout(config, ExpertShard{like.first_expert(), like.stored_experts()},
                         like.layer_shard(), slice);
}

namespace {

std::vector<ParameterRange> merged_ranges(const ParameterLayout& layout, bool cut) {
  std::vector<ParameterRange> ranges;
  for (const ParameterTensor& t : layout.tensors()) {
    if ((t.tp_split != ParameterTensor::TensorSplit::None) != cut) continue;
    if (!ranges.empty() && ranges.back().offset + ranges.back().count == t.offset) {
      ranges.back().count += t.numel;
    } else {
      ranges.push_back({t.offset, t.numel});
    }
  }
  return ranges;
}

void check_same_model(const ParameterLayout& whole, const ParameterLayout& slice) {
  if (whole.tensor_slice().active() || whole.tensors().size() != slice.tensors().size() ||
      whole.first_expert() != slice.first_expert() ||
      whole.stored_experts() != slice.stored_experts()) {
    throw std::invalid_argument(
        "tensor parallel: the whole layout must be the sliced layout's model and experts "
        "without a tensor slice");
  }
}

}  // namespace

std::vector<ParameterRange> tensor_parallel_ranges(const ParameterLayout& layout) {
  return merged_ranges(layout, true);
}

std::vector<ParameterRange> tensor_replicated_ranges(const ParameterLayout& layout) {
  return merged_ranges(layout, false);
}

template <typename T>
void slice_parameters(const T* whole, const ParameterLayout& whole_layout, T* slice,
                      const ParameterLayout& slice_layout) {
  check_same_model(whole_layout, slice_layout);
  const auto& tensors = slice_layout.tensors();
  for (size_t k = 0; k < tensors.size(); ++k) {
    const ParameterTensor& t = tensors[k];
    const T* source = whole + whole_layout.tensors()[k].offset;
    T* target = slice + t.offset;
    if (t.tp_split == ParameterTensor::TensorSplit::None) {
      std::memcpy(target, source, size_t(t.numel) * sizeof(T));
      continue;
    }
    // A cut tensor is never a routed expert's, so the whole layout holds all of it.
    for (int64_t i = 0; i < t.numel; ++i) target[i] = source[t.source_element(i)];
  }
}

template void slice_parameters<float>(const float*, const ParameterLayout&, float*,
                                      const ParameterLayout&);
template void slice_parameters<double>(const double*, const ParameterLayout&, double*,
                                       const ParameterLayout&);

void gather_tensor_parallel(const float* slice, const ParameterLayout& slice_layout, float* whole,
                            const ParameterLayout& whole_layout, const ModelConfig& config,
                            const TensorParallel& tp) {
  check_same_model(whole_layout, slice_layout);
  using Split = ParameterTensor::TensorSplit;
  const auto& tensors = slice_layout.tensors();
  std::vector<float> mine;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const ParameterTensor& t = tensors[k];
    if (t.tp_split == Split::None) {
      std::memcpy(whole + whole_layout.tensors()[k].offset, slice + t.offset,
                  size_t(t.numel) * sizeof(float));
    } else {
      mine.insert(mine.end(), slice + t.offset, slice + t.offset + t.numel);
    }
  }
  // Every rank's slices are the same size (equal blocks).
  std::vector<float> all(mine.size() * size_t(tp.degree()));
  MPI_Allgather(mine.data(), int(mine.size()), MPI_FLOAT, all.data(), int(mine.size()), MPI_FLOAT,
                tp.group().comm);
  for (int r = 0; r < tp.degree(); ++r) {
    const ParameterLayout layout =
        with_tensor_slice(config, slice_layout, {r, tp.degree(), tp.attention_only()});
    const float* packed = all.data() + size_t(r) * mine.size();
    for (size_t k = 0; k < tensors.size(); ++k) {
      const ParameterTensor& t = layout.tensors()[k];
      if (t.tp_split == Split::None) continue;
      const ParameterTensor& w = whole_layout.tensors()[k];
      for (int64_t i = 0; i < t.numel; ++i) whole[w.offset + t.source_element(i)] = packed[i];
      packed += t.numel;
    }
  }
}

uint64_t counted_gather_tensor_parallel(const float* slice, const ParameterLayout& slice_layout,
                                        float* whole, const ParameterLayout& whole_layout,
                                        const ModelConfig& config, const TensorParallel& tp) {
  gather_tensor_parallel(slice, slice_layout, whole, whole_layout, config, tp);
  uint64_t cut_bytes = 0;
  for (const ParameterRange& r : tensor_parallel_ranges(slice_layout))
    cut_bytes += uint64_t(r.count) * sizeof(float);
  const HierarchicalComm& group = tp.group();
  for (int r = 0; r < group.size(); ++r) {
    if (r != tp.rank()) tp.links().count_send(group.world_ranks[size_t(r)], cut_bytes);
  }
  return cut_bytes * uint64_t(group.size() - 1);
}

}  // namespace rlf
