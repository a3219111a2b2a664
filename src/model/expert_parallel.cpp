#include "src/model/expert_parallel.h"

#include <cstring>
#include <vector>

#include "mpi_comm/hierarchical_collectives.h"

namespace rlf {

bool is_expert_tensor(const ParameterTensor& tensor) {
  return tensor.name.find(".experts.") != std::string::npos;
}

void allreduce_replicated_gradients(float* grads, const ParameterLayout& layout,
                                    const HierarchicalComm& ep, Links& links, bool hierarchical) {
  // Packed so the reduction is one collective over only the bytes that need it.
  std::vector<float> packed;
  for (const ParameterTensor& t : layout.tensors()) {
    if (!is_expert_tensor(t))
      packed.insert(packed.end(), grads + t.offset, grads + t.offset + t.numel);
  }
  if (hierarchical) {
    allreduce_sum(packed.data(), int64_t(packed.size()), ep, links);
  } else {
    flat_allreduce_sum(packed.data(), int64_t(packed.size()), ep, links);
  }
  size_t at = 0;
  for (const ParameterTensor& t : layout.tensors()) {
    if (is_expert_tensor(t)) continue;
    std::memcpy(grads + t.offset, packed.data() + at, size_t(t.numel) * sizeof(float));
    at += size_t(t.numel);
  }
}

}  // namespace rlf
