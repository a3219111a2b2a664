#include "src/runtime/expert_weight_sync.h"

#include <algorithm>
#include <vector>

#include "src/model/expert_parallel.h"

namespace rlf {

namespace {

constexpr int kTag = 7401;
constexpr int kTableTag = 7402;

int index_of(const std::vector<int>& ranks, int world_rank) {
  const auto at = std::find(ranks.begin(), ranks.end(), world_rank);
  return at == ranks.end() ? -1 : int(at - ranks.begin());
}

}  // namespace

ExpertWeightSync::ExpertWeightSync(MPI_Comm world, Topology& topology, int experts, int learner_ep,
                                   int actor_ep, int learner_redundant_slots)
    : topology_(topology),
      experts_(experts),
      learner_ep_(learner_ep),
      actor_ep_(actor_ep),
      learner_redundant_slots_(learner_redundant_slots) {
  MPI_Comm_dup(world, &comm_);
}

ExpertWeightSync::~ExpertWeightSync() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

uint64_t ExpertWeightSync::sync(float* params, const ParameterLayout& layout,
                                WeightSync& replicated,
                                const std::vector<std::vector<int>>* learner_slots) {
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
  const int learner_index = index_of(learners, me);
  const bool sender = role == Role::Learner && learner_index >= 0 && learner_index < learner_ep_;
  if (role != Role::Actor && !sender) return bytes;
  // The learners' expert -> slot tables, [layer * experts + expert]: learner 0 tells every actor.
  const int layers = expert_layers(layout);
  std::vector<int> slot_of(static_cast<size_t>(layers) * size_t(experts_));
  for (size_t i = 0; i < slot_of.size(); ++i) slot_of[i] = int(i % size_t(experts_));
  if (role == Role::Learner && learner_slots && !learner_slots->empty()) {
    for (int l = 0; l < layers; ++l) {
      std::copy((*learner_slots)[size_t(l)].begin(), (*learner_slots)[size_t(l)].end(),
                slot_of.begin() + int64_t(l) * experts_);
    }
  }
  const uint64_t table_bytes = slot_of.size() * sizeof(int);
  if (learner_index == 0) {
    for (int actor : actors) {
      links.send(slot_of.data(), table_bytes, actor, kTableTag, comm_);
      bytes += table_bytes;
    }
  } else if (role == Role::Actor) {
    bytes += links.recv(slot_of.data(), table_bytes, learners.front(), kTableTag, comm_);
  }
  const int local = experts_ / learner_ep_ + learner_redundant_slots_;  // slots per learner
  // Layer by layer, the experts of `actor_shard` that learner `l` holds, in expert order, each
  // with its slices (from `slot` on the learner, `expert` on the actor): the message's content on
  // both sides.
  auto shared_slices = [&](int l, ExpertShard actor_shard, bool by_slot) {
    std::vector<ParameterRange> ranges;
    for (int layer = 0; layer < layers; ++layer) {
      for (int e = actor_shard.first; e < actor_shard.first + actor_shard.count; ++e) {
        const int slot = slot_of[size_t(layer) * size_t(experts_) + size_t(e)];
        if (slot / local != l) continue;
        const std::vector<ParameterRange> one = expert_slices(layout, by_slot ? slot : e, 1, layer);
        ranges.insert(ranges.end(), one.begin(), one.end());
      }
    }
    return ranges;
  };
  // Sends go actor by actor and receives learner by learner: a fixed order on both sides, so
  // the blocking point-to-point messages cannot wait on each other in a cycle.
  if (sender) {
    for (size_t a = 0; a < actors.size(); ++a) {
      const std::vector<ParameterRange> ranges = shared_slices(
          learner_index, expert_shard_of(int(a), actor_ep_, experts_), /*by_slot=*/true);
      if (ranges.empty()) continue;
      const std::vector<float> slices = pack_ranges(params, ranges);
      links.send(slices.data(), slices.size() * sizeof(float), actors[a], kTag, comm_);
      bytes += slices.size() * sizeof(float);
    }
  } else {
    const ExpertShard mine = expert_shard_of(index_of(actors, me), actor_ep_, experts_);
    for (int l = 0; l < learner_ep_; ++l) {
      const std::vector<ParameterRange> ranges = shared_slices(l, mine, /*by_slot=*/false);
      if (ranges.empty()) continue;
      std::vector<float> slices(size_t(ranges_size(ranges)));
      bytes += links.recv(slices.data(), slices.size() * sizeof(float), learners[size_t(l)], kTag,
                          comm_);
      unpack_ranges(slices.data(), ranges, params);
    }
  }
  return bytes;
}

}  // namespace rlf
