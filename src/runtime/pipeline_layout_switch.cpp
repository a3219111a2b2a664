#include "src/runtime/pipeline_layout_switch.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace rlf {

void copy_shared_tensors(const float* from, const ParameterLayout& from_layout, float* to,
                         const ParameterLayout& to_layout) {
  // A target that stores some of the experts of a source storing all of them takes their rows:
  // its own experts' (with redundant slots the first rows; the spare ones are left for
  // RoleExpertParallel::fill_redundant_slots).
  const bool own_expert_rows = !from_layout.expert_sharded() && to_layout.expert_sharded();
  const ExpertShard own = to_layout.own_experts();
  for (const ParameterTensor& source : from_layout.tensors()) {
    const ParameterTensor* target = to_layout.find(source.name);
    if (!target) continue;
    const bool rows = own_expert_rows && is_expert_tensor(source);
    const int64_t per_expert = source.numel / source.shape[0];
    const int64_t skip = rows ? per_expert * own.first : 0;
    const int64_t count = rows ? per_expert * own.count : target->numel;
    if (rows ? skip + count > source.numel || count > target->numel
             : target->numel != source.numel) {
      throw std::invalid_argument("copy_shared_tensors: tensor " + source.name +
                                  " has another size in the two layouts");
    }
    std::memcpy(to + target->offset, from + source.offset + skip, size_t(count) * sizeof(float));
  }
}

namespace {

// This rank's stage with `experts` at the TP slice `slice` (inactive: whole tensors), regrouped
// inside its TP group from the training slices (counted; the experts are whole on every TP rank).
// Returns the bytes received.
uint64_t regroup_stage(const float* training_slice, const PipelineGroups& groups, TensorSlice slice,
                       ExpertShard experts, std::vector<float>& stage) {
  const TensorParallel& tp = *groups.tensor_parallel();
  const ParameterLayout stage_layout = groups.stage_layout(groups.stage(), experts);
  const ParameterLayout from = with_tensor_slice(groups.config(), stage_layout, tp.slice());
  const ParameterLayout to = with_tensor_slice(groups.config(), stage_layout, slice);
  stage.assign(size_t(to.total()), 0.0f);
  return regroup_tensor_slices(training_slice, from, stage.data(), to, groups.config(), tp);
}

bool same_slice(const TensorSlice& a, const TensorSlice& b) {
  return a.rank == b.rank && a.size == b.size && a.attention_only == b.attention_only;
}

// Writes the whole model (laid out by `whole_layout`, zeroed first so that the buffer is the
// single-rank one byte for byte, alignment gaps included) from this rank's stage `own_params` and
// the other stages received at `received` + offsets[s], stage s laid out by layouts[s]. Each
// stage's layers cross the link from its rank: an emulated inter-node link delays them (one after
// another: a rank's incoming messages share its port). Returns the bytes received.
uint64_t assemble_stages(const PipelineGroups& groups, const float* own_params,
                         const float* received, const std::vector<ParameterLayout>& layouts,
                         const std::vector<int>& offsets, float* whole,
                         const ParameterLayout& whole_layout) {
  const int own = groups.stage();
  std::fill_n(whole, whole_layout.total(), 0.0f);
  copy_shared_tensors(own_params, layouts[size_t(own)], whole, whole_layout);
  uint64_t bytes_received = 0;
  for (int s = 0; s < int(layouts.size()); ++s) {
    if (s == own) continue;
    copy_shared_tensors(received + offsets[size_t(s)], layouts[size_t(s)], whole, whole_layout);
    const uint64_t bytes = uint64_t(layouts[size_t(s)].total()) * sizeof(float);
    groups.links().emulate(groups.pipeline().world_ranks[size_t(s)], bytes);
    bytes_received += bytes;
  }
  return bytes_received;
}

// Stages without TP and a whole model at a TP slice (training at TP 1 generating at TP G): the
// ranks of a pipeline may assemble different slices (generation TP groups are consecutive ranks,
// so are pipelines), so each stage cuts, for every other rank of its pipeline, that rank's slice
// of its layers and sends it (an all-to-all inside the pipeline), and copies its own slice of its
// own layers locally. Every rank receives only its slice of the other stages. Returns the bytes
// received.
uint64_t gather_pipeline_slices(const float* stage_params, const PipelineGroups& groups,
                                float* whole, const ParameterLayout& whole_layout,
                                ExpertShard experts) {
  const HierarchicalComm& pipeline = groups.pipeline();
  const int stages = pipeline.size(), own = groups.stage();
  const TensorSlice slice = whole_layout.tensor_slice();
  std::vector<int> slice_ranks(static_cast<size_t>(stages));
  MPI_Allgather(&slice.rank, 1, MPI_INT, slice_ranks.data(), 1, MPI_INT, pipeline.comm);
  auto at_slice = [&](const ParameterLayout& layout, int rank) {
    TensorSlice cut = slice;
    cut.rank = rank;
    return with_tensor_slice(groups.config(), layout, cut);
  };
  const ParameterLayout own_stage = groups.stage_layout(own, experts);
  std::vector<ParameterLayout> sent, received_layouts;
  std::vector<int> send_counts(size_t(stages), 0), send_offsets(size_t(stages), 0);
  std::vector<int> receive_counts(size_t(stages), 0), receive_offsets(size_t(stages), 0);
  int64_t send_total = 0, receive_total = 0;
  for (int s = 0; s < stages; ++s) {
    sent.push_back(at_slice(own_stage, slice_ranks[size_t(s)]));
    received_layouts.push_back(at_slice(groups.stage_layout(s, experts), slice.rank));
    if (s == own) continue;
    send_counts[size_t(s)] = int(sent.back().total());
    send_offsets[size_t(s)] = int(send_total);
    send_total += sent.back().total();
    receive_counts[size_t(s)] = int(received_layouts.back().total());
    receive_offsets[size_t(s)] = int(receive_total);
    receive_total += received_layouts.back().total();
  }
  std::vector<float> to_send(static_cast<size_t>(send_total));
  for (int s = 0; s < stages; ++s) {
    if (s == own) continue;
    slice_parameters(stage_params, own_stage, to_send.data() + send_offsets[size_t(s)],
                     sent[size_t(s)]);
    groups.links().count_send(pipeline.world_ranks[size_t(s)],
                              uint64_t(send_counts[size_t(s)]) * sizeof(float));
  }
  std::vector<float> received(static_cast<size_t>(receive_total));
  MPI_Alltoallv(to_send.data(), send_counts.data(), send_offsets.data(), MPI_FLOAT, received.data(),
                receive_counts.data(), receive_offsets.data(), MPI_FLOAT, pipeline.comm);
  to_send = {};
  std::vector<float> own_slice(static_cast<size_t>(sent[size_t(own)].total()));
  slice_parameters(stage_params, own_stage, own_slice.data(), sent[size_t(own)]);
  return assemble_stages(groups, own_slice.data(), received.data(), received_layouts,
                         receive_offsets, whole, whole_layout);
}

}  // namespace

uint64_t gather_pipeline_model(const float* stage_params, const PipelineGroups& groups,
                               float* whole, const ParameterLayout& whole_layout, int root) {
  std::vector<float> stage;
  uint64_t received = 0;
  // With TP the stage is first regrouped inside the TP group to the whole model's slice (whole
  // tensors for an unsliced one); at the training slice nothing moves.
  const TensorSlice slice = whole_layout.tensor_slice();
  const TensorParallel* tp = groups.tensor_parallel();
  // The stages hold the experts the whole model holds (with EP, the pipeline's own, or every
  // expert when saving the gathered model).
  const ExpertShard experts =
      whole_layout.expert_sharded() ? whole_layout.stored_expert_shard() : ExpertShard{};
  if (slice.active() && !tp) {
    if (root >= 0) {
      throw std::invalid_argument("gather_pipeline_model: a sliced whole model onto a root");
    }
    return gather_pipeline_slices(stage_params, groups, whole, whole_layout, experts);
  }
  if (root >= 0 && tp && !slice.active()) {
    // Onto one rank only: TP rank 0 of each stage assembles its stage's whole tensors (a gather
    // inside the TP group), and only its pipeline goes on; the other TP ranks are done.
    const ParameterLayout stage_layout = groups.stage_layout(groups.stage(), experts);
    const ParameterLayout from = with_tensor_slice(groups.config(), stage_layout, tp->slice());
    if (tp->rank() == 0) stage.assign(size_t(stage_layout.total()), 0.0f);
    received += gather_tensor_parallel_on_rank_zero(stage_params, from,
                                                    tp->rank() == 0 ? stage.data() : nullptr,
                                                    stage_layout, groups.config(), *tp);
    if (tp->rank() != 0) return received;
    stage_params = stage.data();
  } else if (tp && !same_slice(slice, tp->slice())) {
    received += regroup_stage(stage_params, groups, slice, experts, stage);
    stage_params = stage.data();
  }
  const HierarchicalComm& pipeline = groups.pipeline();
  const int stages = pipeline.size(), own = groups.stage();
  std::vector<ParameterLayout> layouts;
  std::vector<int> counts, displacements;
  int64_t total = 0;
  for (int s = 0; s < stages; ++s) {
    const ParameterLayout stage_layout = groups.stage_layout(s, experts);
    layouts.push_back(slice.active() ? with_tensor_slice(groups.config(), stage_layout, slice)
                                     : stage_layout);
    counts.push_back(int(layouts.back().total()));
    displacements.push_back(int(total));
    total += layouts.back().total();
  }
  if (root >= stages) throw std::invalid_argument("gather_pipeline_model: no such root stage");
  const bool assembles = root < 0 || own == root;
  // The stages side by side, each in its own layout, then each copied into the whole model.
  std::vector<float> stages_side_by_side(assembles ? static_cast<size_t>(total) : 0);
  const uint64_t own_bytes = uint64_t(counts[size_t(own)]) * sizeof(float);
  if (root < 0) {
    MPI_Allgatherv(stage_params, counts[size_t(own)], MPI_FLOAT, stages_side_by_side.data(),
                   counts.data(), displacements.data(), MPI_FLOAT, pipeline.comm);
    for (int s = 0; s < stages; ++s) {
      if (s != own) groups.links().count_send(pipeline.world_ranks[size_t(s)], own_bytes);
    }
  } else {
    MPI_Gatherv(stage_params, counts[size_t(own)], MPI_FLOAT, stages_side_by_side.data(),
                counts.data(), displacements.data(), MPI_FLOAT, root, pipeline.comm);
    if (own != root) groups.links().count_send(pipeline.world_ranks[size_t(root)], own_bytes);
  }
  if (!assembles) return received;
  return received + assemble_stages(groups, stage_params, stages_side_by_side.data(), layouts,
                                    displacements, whole, whole_layout);
}

bool assembles_pipeline_model(const PipelineGroups& groups) {
  return groups.stage() == 0 &&
         (!groups.tensor_parallel() || groups.tensor_parallel()->rank() == 0);
}

}  // namespace rlf
