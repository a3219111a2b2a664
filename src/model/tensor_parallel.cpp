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
  const TrafficScope layer_traffic(links_, TrafficKind::TensorParallel);
  if (slice_.size > 1) flat_allreduce_sum(data, count, groups_.members, links_);
}

void TensorParallel::allreduce_sum(double*, int64_t) const {
  throw std::logic_error("tensor parallelism needs float parameters");
}

RowShare tensor_parallel_row_share(int N, int degree, int rank) {
  const auto first = [&](int r) { return int(int64_t(N) * r / degree); };
  return {first(rank), first(rank + 1) - first(rank)};
}

void TensorParallel::allgather_rows(float* rows, int N, int width) const {
  counters_.allgathers += 1;
  counters_.allgathered_elements += int64_t(N) * width;
  if (slice_.size == 1) return;
  std::vector<uint64_t> offsets;
  for (int r = 0; r <= slice_.size; ++r) {
    offsets.push_back(uint64_t(tensor_parallel_row_share(N, slice_.size, r).first) *
                      uint64_t(width) * sizeof(float));
  }
  const TrafficScope layer_traffic(links_, TrafficKind::TensorParallel);
  flat_allgather(rows, offsets, groups_.members, links_);
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
  return ParameterLayout(config, like.stored_expert_shard(), like.layer_shard(), slice);
}

namespace {

bool is_cut(const ParameterTensor& t) {
  return t.tp_split != ParameterTensor::TensorSplit::None;
}

// The tensors of `layout` that `keep` selects, adjacent ones merged.
template <typename Keep>
std::vector<ParameterRange> merged_ranges(const ParameterLayout& layout, Keep keep) {
  std::vector<ParameterRange> ranges;
  for (const ParameterTensor& t : layout.tensors()) {
    if (!keep(t)) continue;
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

// The cut tensors of `packed` (slice `layout`'s, in layout order) written into their elements of
// `whole` (laid out by `whole_layout`).
void unpack_cut_tensors(const float* packed, const ParameterLayout& layout, float* whole,
                        const ParameterLayout& whole_layout) {
  for (size_t k = 0; k < layout.tensors().size(); ++k) {
    const ParameterTensor& t = layout.tensors()[k];
    if (t.tp_split == ParameterTensor::TensorSplit::None) continue;
    const ParameterTensor& w = whole_layout.tensors()[k];
    for (int64_t i = 0; i < t.numel; ++i) whole[w.offset + t.source_element(i)] = packed[i];
    packed += t.numel;
  }
}

// The tensors tensor parallelism leaves whole, from a slice into the whole layout.
void copy_replicated_tensors(const float* slice, const ParameterLayout& slice_layout, float* whole,
                             const ParameterLayout& whole_layout) {
  const auto& tensors = slice_layout.tensors();
  for (size_t k = 0; k < tensors.size(); ++k) {
    const ParameterTensor& t = tensors[k];
    if (t.tp_split == ParameterTensor::TensorSplit::None) {
      std::memcpy(whole + whole_layout.tensors()[k].offset, slice + t.offset,
                  size_t(t.numel) * sizeof(float));
    }
  }
}

// This rank's cut tensors packed in layout order.
std::vector<float> pack_cut_tensors(const float* slice, const ParameterLayout& layout) {
  std::vector<float> packed;
  for (const ParameterTensor& t : layout.tensors()) {
    if (t.tp_split != ParameterTensor::TensorSplit::None)
      packed.insert(packed.end(), slice + t.offset, slice + t.offset + t.numel);
  }
  return packed;
}

}  // namespace

std::vector<ParameterRange> tensor_parallel_ranges(const ParameterLayout& layout) {
  return merged_ranges(layout, is_cut);
}

std::vector<ParameterRange> tensor_replicated_ranges(const ParameterLayout& layout) {
  return merged_ranges(layout, [](const ParameterTensor& t) { return !is_cut(t); });
}

std::vector<ParameterRange> tensor_replicated_dense_ranges(const ParameterLayout& layout) {
  return merged_ranges(layout,
                       [](const ParameterTensor& t) { return !is_cut(t) && !is_expert_tensor(t); });
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
    slice_tensor(t, source, target);
  }
}

template void slice_parameters<float>(const float*, const ParameterLayout&, float*,
                                      const ParameterLayout&);
template void slice_parameters<double>(const double*, const ParameterLayout&, double*,
                                       const ParameterLayout&);

namespace {

// The whole model from every TP rank's slice, on every rank of the group (`to_all`) or on TP rank
// 0 only (`whole` may be null elsewhere). Returns the bytes this rank received.
uint64_t assemble_tensor_slices(const float* slice, const ParameterLayout& slice_layout,
                                float* whole, const ParameterLayout& whole_layout,
                                const ModelConfig& config, const TensorParallel& tp, bool to_all) {
  check_same_model(whole_layout, slice_layout);
  const std::vector<float> mine = pack_cut_tensors(slice, slice_layout);
  const int count = int(mine.size());  // every rank's slices are the same size (equal blocks)
  const bool assembles = to_all || tp.rank() == 0;
  std::vector<float> all(assembles ? mine.size() * size_t(tp.degree()) : 0);
  if (to_all) {
    MPI_Allgather(mine.data(), count, MPI_FLOAT, all.data(), count, MPI_FLOAT, tp.group().comm);
    // (Counted as a flat allgather sends it: this rank's slices to each other rank.)
    for (int r = 0; r < tp.degree(); ++r) {
      if (r != tp.rank())
        tp.links().count_send(tp.group().world_ranks[size_t(r)], uint64_t(count) * sizeof(float));
    }
  } else {
    MPI_Gather(mine.data(), count, MPI_FLOAT, all.data(), count, MPI_FLOAT, 0, tp.group().comm);
    if (tp.rank() != 0)
      tp.links().count_send(tp.group().world_ranks[0], uint64_t(count) * sizeof(float));
  }
  if (!assembles) return 0;
  copy_replicated_tensors(slice, slice_layout, whole, whole_layout);
  for (int r = 0; r < tp.degree(); ++r) {
    unpack_cut_tensors(
        all.data() + size_t(r) * mine.size(),
        with_tensor_slice(config, slice_layout, {r, tp.degree(), tp.attention_only()}), whole,
        whole_layout);
  }
  return uint64_t(count) * uint64_t(tp.degree() - 1) * sizeof(float);
}

}  // namespace

void gather_tensor_parallel(const float* slice, const ParameterLayout& slice_layout, float* whole,
                            const ParameterLayout& whole_layout, const ModelConfig& config,
                            const TensorParallel& tp) {
  assemble_tensor_slices(slice, slice_layout, whole, whole_layout, config, tp, /*to_all=*/true);
}

uint64_t gather_tensor_parallel_on_rank_zero(const float* slice,
                                             const ParameterLayout& slice_layout, float* whole,
                                             const ParameterLayout& whole_layout,
                                             const ModelConfig& config, const TensorParallel& tp) {
  return assemble_tensor_slices(slice, slice_layout, whole, whole_layout, config, tp,
                                /*to_all=*/false);
}

uint64_t regroup_tensor_slices(const float* slice, const ParameterLayout& slice_layout,
                               float* target, const ParameterLayout& target_layout,
                               const ModelConfig& config, const TensorParallel& tp) {
  const TensorSlice wanted = target_layout.tensor_slice();
  const int degree = tp.degree(), rank = tp.rank();
  if (wanted.size < 1 || degree % wanted.size != 0 || wanted.rank != rank % wanted.size ||
      wanted.attention_only != tp.attention_only()) {
    throw std::invalid_argument(
        "regroup_tensor_slices: the target must be slice rank % G of a degree G dividing the TP "
        "degree");
  }
  // Training slice r is part of generation slice r / per_target; rank t needs generation slice
  // t % G, so it takes training slices [(t % G) per_target, (t % G + 1) per_target).
  const int per_target = degree / wanted.size;
  auto needs = [&](int taker, int giver) { return giver / per_target == taker % wanted.size; };
  const std::vector<float> mine = pack_cut_tensors(slice, slice_layout);
  const int count = int(mine.size());  // every rank's cut tensors are the same size
  std::vector<int> send_counts(size_t(degree), 0), receive_counts(size_t(degree), 0),
      send_displacements(size_t(degree), 0), receive_displacements(size_t(degree), 0);
  int received = 0;
  for (int r = 0; r < degree; ++r) {
    if (r == rank) continue;
    if (needs(r, rank)) send_counts[size_t(r)] = count;
    if (needs(rank, r)) {
      receive_counts[size_t(r)] = count;
      receive_displacements[size_t(r)] = received;
      received += count;
    }
  }
  std::vector<float> incoming(static_cast<size_t>(received));
  MPI_Alltoallv(mine.data(), send_counts.data(), send_displacements.data(), MPI_FLOAT,
                incoming.data(), receive_counts.data(), receive_displacements.data(), MPI_FLOAT,
                tp.group().comm);
  const HierarchicalComm& group = tp.group();
  for (int r = 0; r < degree; ++r) {
    if (send_counts[size_t(r)] > 0) {
      tp.links().count_send(group.world_ranks[size_t(r)], uint64_t(count) * sizeof(float));
    }
  }
  // The wanted slices assembled into whole tensors, then the target's slice of them (whole
  // tensors copied from this rank's).
  const ParameterLayout whole_layout = with_tensor_slice(config, slice_layout, TensorSlice{});
  std::vector<float> whole(size_t(whole_layout.total()), 0.0f);
  copy_replicated_tensors(slice, slice_layout, whole.data(), whole_layout);
  for (int r = 0; r < degree; ++r) {
    if (!needs(rank, r)) continue;
    const float* packed =
        r == rank ? mine.data() : incoming.data() + receive_displacements[size_t(r)];
    unpack_cut_tensors(packed,
                       with_tensor_slice(config, slice_layout, {r, degree, tp.attention_only()}),
                       whole.data(), whole_layout);
  }
  slice_parameters(whole.data(), whole_layout, target, target_layout);
  return uint64_t(received) * sizeof(float);
}

}  // namespace rlf
