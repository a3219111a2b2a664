#include "src/roles/rollout_allgather.h"

#include <span>

#include "mpi_comm/counted_allgather.h"
#include "src/roles/rollout_samples.h"
#include "src/roles/sample_packing.h"

namespace rlf {

std::vector<Rollout> allgather_rollouts(const HierarchicalComm& group, Links& links,
                                        const std::vector<Rollout>& own, int group_size,
                                        std::vector<size_t>* blocks) {
  std::vector<int> displacements;
  const std::vector<std::byte> all = allgather_counted(
      group, links, pack_samples(to_queue_samples(own, group_size)), MPI_BYTE, displacements);
  const size_t ranks = displacements.size();
  std::vector<QueueSample> samples;
  if (blocks) blocks->assign(ranks, 0);
  for (size_t r = 0; r < ranks; ++r) {
    const size_t begin = size_t(displacements[r]);
    const size_t end = r + 1 < ranks ? size_t(displacements[r + 1]) : all.size();
    const size_t before = samples.size();
    unpack_samples_into(std::span<const std::byte>(all).subspan(begin, end - begin), samples);
    if (blocks) (*blocks)[r] = samples.size() - before;
  }
  return to_rollouts(samples);
}

}  // namespace rlf
