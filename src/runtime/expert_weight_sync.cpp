#include "src/runtime/expert_weight_sync.h"

#include <algorithm>
#include <vector>

#include "src/model/expert_parallel.h"

namespace rlf {

namespace {

constexpr int kTag = 7401;

int index_of(const std::vector<int>& ranks, int world_rank) {
  const auto at = std::find(ranks.begin(), ranks.end(), world_rank);
  return at == ranks.end() ? -1 : int(at - ranks.begin());
}

}  // namespace

ExpertWeightSync::ExpertWeightSync(MPI_Comm world, Topology& topology, int experts, int learner_ep,
                                   int actor_ep)
    : topology_(topology), experts_(experts), learner_ep_(learner_ep), actor_ep_(actor_ep) {
  MPI_Comm_dup(world, &comm_);
}

ExpertWeightSync::~ExpertWeightSync() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

uint64_t ExpertWeightSync::sync(float* params, const ParameterLayout& layout,
                                WeightSync& replicated) {
  uint64_t bytes = 0;
  const Role role = topology_.role();
  if (replicated.member()) {
    const std::vector<ParameterRange> ranges = replicated_ranges(layout);
    std::vector<float> packed = role == Role::Learner
                                    ? pack_ranges(params, ranges)
                                    : std::vector<float>(size_t(ranges_size(ranges)));
    bytes += replicated.broadcast(packed.data(), int64_t(packed.size()));
    if (role == Role::Actor) unpack_ranges(packed.data(), ranges, params);
  }
  const std::vector<int>& learners = topology_.ranks_of(Role::Learner);
  const std::vector<int>& actors = topology_.ranks_of(Role::Actor);
  const int me = topology_.world_rank();
  Links& links = topology_.links();
  // Sends go actor by actor and receives learner by learner: a fixed order on both sides, so
  // the blocking point-to-point messages cannot wait on each other in a cycle.
  if (role == Role::Learner && index_of(learners, me) < learner_ep_) {
    const ExpertShard mine = expert_shard_of(index_of(learners, me), learner_ep_, experts_);
    for (size_t a = 0; a < actors.size(); ++a) {
      const ExpertShard both = shard_overlap(mine, expert_shard_of(int(a), actor_ep_, experts_));
      if (both.count <= 0) continue;
      const std::vector<float> slices =
          pack_ranges(params, expert_slices(layout, both.first, both.count));
      links.send(slices.data(), slices.size() * sizeof(float), actors[a], kTag, comm_);
      bytes += slices.size() * sizeof(float);
    }
  } else if (role == Role::Actor) {
    const ExpertShard mine = expert_shard_of(index_of(actors, me), actor_ep_, experts_);
    for (int l = 0; l < learner_ep_; ++l) {
      const ExpertShard both = shard_overlap(mine, expert_shard_of(l, learner_ep_, experts_));
      if (both.count <= 0) continue;
      const std::vector<ParameterRange> ranges = expert_slices(layout, both.first, both.count);
      std::vector<float> slices(size_t(ranges_size(ranges)));
      bytes += links.recv(slices.data(), slices.size() * sizeof(float), learners[size_t(l)], kTag,
                          comm_);
      unpack_ranges(slices.data(), ranges, params);
    }
  }
  return bytes;
}

}  // namespace rlf
