#include "src/runtime/pipeline_layout_switch.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace rlf {

void copy_shared_tensors(const float* from, const ParameterLayout& from_layout, float* to,
                         const ParameterLayout& to_layout) {
  for (const ParameterTensor& source : from_layout.tensors()) {
    const ParameterTensor* target = to_layout.find(source.name);
    if (!target) continue;
    if (target->numel != source.numel) {
      throw std::invalid_argument("copy_shared_tensors: tensor " + source.name +
                                  " has another size in the two layouts");
    }
    std::memcpy(to + target->offset, from + source.offset, size_t(source.numel) * sizeof(float));
  }
}

uint64_t gather_pipeline_model(const float* stage_params, const PipelineGroups& groups,
                               float* whole, const ParameterLayout& whole_layout) {
  const HierarchicalComm& pipeline = groups.pipeline();
  const int stages = pipeline.size(), own = groups.stage();
  std::vector<ParameterLayout> layouts;
  std::vector<int> counts, displacements;
  int64_t total = 0;
  for (int s = 0; s < stages; ++s) {
    layouts.push_back(groups.stage_layout(s));
    counts.push_back(int(layouts.back().total()));
    displacements.push_back(int(total));
    total += layouts.back().total();
  }
  // The stages side by side, each in its own layout, then each copied into the whole model.
  std::vector<float> stages_side_by_side(static_cast<size_t>(total));
  MPI_Allgatherv(stage_params, counts[size_t(own)], MPI_FLOAT, stages_side_by_side.data(),
                 counts.data(), displacements.data(), MPI_FLOAT, pipeline.comm);
  const uint64_t own_bytes = uint64_t(counts[size_t(own)]) * sizeof(float);
  for (int s = 0; s < stages; ++s) {
    if (s != own) groups.links().count_send(pipeline.world_ranks[size_t(s)], own_bytes);
  }
  // Zeroed first: the whole model's buffer is then the single-rank one byte for byte, alignment
  // gaps between its tensors included.
  std::fill_n(whole, whole_layout.total(), 0.0f);
  copy_shared_tensors(stage_params, layouts[size_t(own)], whole, whole_layout);
  uint64_t received = 0;
  for (int s = 0; s < stages; ++s) {
    if (s == own) continue;
    copy_shared_tensors(stages_side_by_side.data() + displacements[size_t(s)], layouts[size_t(s)],
                        whole, whole_layout);
    received += uint64_t(counts[size_t(s)]) * sizeof(float);
  }
  return received;
}

}  // namespace rlf
