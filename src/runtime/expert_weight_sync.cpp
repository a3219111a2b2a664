#include "src/runtime/expert_weight_sync.h"

#include <algorithm>
#include <stdexcept>
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
                                   int actor_ep, int learner_redundant_slots, int learner_tp,
                                   int actor_tp)
    : topology_(topology),
      experts_(experts),
      learner_ep_(learner_ep),
      actor_ep_(actor_ep),
      learner_redundant_slots_(learner_redundant_slots),
      learner_tp_(learner_tp),
      actor_tp_(actor_tp) {
  MPI_Comm_dup(world, &comm_);
}

ExpertWeightSync::~ExpertWeightSync() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

ExpertWeightSync::Plan ExpertWeightSync::plan(
    const ParameterLayout& layout, const std::vector<std::vector<int>>* learner_slots) const {
  Plan plan;
  const std::vector<int>& learners = topology_.ranks_of(Role::Learner);
  const int me = topology_.world_rank();
  plan.learner_index = index_of(learners, me);
  plan.role = topology_.role();
  if (plan.learner_index >= 0 && plan.learner_index % learner_tp_ == 0)
    plan.ep_rank = plan.learner_index / learner_tp_;
  plan.sender = plan.role == Role::Learner && plan.ep_rank >= 0 && plan.ep_rank < learner_ep_;
  // The learners' expert -> slot tables, [layer * experts + expert]: learner 0 tells every actor.
  plan.layers = expert_layers(layout);
  plan.slot_of.resize(static_cast<size_t>(plan.layers) * size_t(experts_));
  for (size_t i = 0; i < plan.slot_of.size(); ++i) plan.slot_of[i] = int(i % size_t(experts_));
  if (plan.role == Role::Learner && learner_slots && !learner_slots->empty()) {
    for (int l = 0; l < plan.layers; ++l) {
      std::copy((*learner_slots)[size_t(l)].begin(), (*learner_slots)[size_t(l)].end(),
                plan.slot_of.begin() + int64_t(l) * experts_);
    }
  }
  return plan;
}

std::vector<ParameterRange> ExpertWeightSync::shared_slices(const Plan& plan,
                                                            const ParameterLayout& layout, int l,
                                                            ExpertShard actor_shard,
                                                            bool by_slot) const {
  const int local = experts_ / learner_ep_ + learner_redundant_slots_;  // slots per learner
  std::vector<ParameterRange> ranges;
  for (int layer = 0; layer < plan.layers; ++layer) {
    for (int e = actor_shard.first; e < actor_shard.first + actor_shard.count; ++e) {
      const int slot = plan.slot_of[size_t(layer) * size_t(experts_) + size_t(e)];
      if (slot / local != l) continue;
      const std::vector<ParameterRange> one = expert_slices(layout, by_slot ? slot : e, 1, layer);
      ranges.insert(ranges.end(), one.begin(), one.end());
    }
  }
  return ranges;
}

uint64_t ExpertWeightSync::receive_routed(float* params, const ParameterLayout& layout) {
  const std::vector<int>& learners = topology_.ranks_of(Role::Learner);
  const std::vector<int>& actors = topology_.ranks_of(Role::Actor);
  Links& links = topology_.links();
  Plan plan = this->plan(layout, nullptr);
  uint64_t bytes = links.recv(plan.slot_of.data(), plan.slot_of.size() * sizeof(int),
                              learners.front(), kTableTag, comm_);
  const ExpertShard mine =
      expert_shard_of(index_of(actors, topology_.world_rank()) / actor_tp_, actor_ep_, experts_);
  for (int l = 0; l < learner_ep_; ++l) {
    const std::vector<ParameterRange> ranges = shared_slices(plan, layout, l, mine, false);
    if (ranges.empty()) continue;
    std::vector<float> slices(size_t(ranges_size(ranges)));
    bytes += links.recv(slices.data(), slices.size() * sizeof(float),
                        learners[size_t(l) * size_t(learner_tp_)], kTag, comm_);
    unpack_ranges(slices.data(), ranges, params);
  }
  return bytes;
}

uint64_t ExpertWeightSync::send_routed(const Plan& plan, const float* params,
                                       const ParameterLayout& layout, bool posted) {
  const std::vector<int>& actors = topology_.ranks_of(Role::Actor);
  Links& links = topology_.links();
  uint64_t bytes = 0;
  // Posted: every message from a buffer of its own that outlives the call, sent without waiting.
  auto send = [&](auto buffer, int actor, int tag) {
    const uint64_t n = buffer.size() * sizeof(buffer[0]);
    const TrafficScope traffic(links, TrafficKind::WeightSync);
    if (!posted) {
      links.send(buffer.data(), n, actor, tag, comm_);
    } else {
      links.count_send(actor, n);
      auto owned = std::make_shared<decltype(buffer)>(std::move(buffer));
      pending_.requests.emplace_back();
      MPI_Isend(owned->data(), checked_count(n, "ExpertWeightSync"), MPI_BYTE, actor, tag, comm_,
                &pending_.requests.back());
      pending_.buffers.push_back(std::move(owned));
    }
    bytes += n;
  };
  if (RoutingLog* log = links.routing_log()) {
    // The sync's inputs, for plan --validate: the learners' placement.
    std::vector<int> actor_nodes;
    for (int actor : actors) actor_nodes.push_back(links.node_of(actor));
    const int local = experts_ / learner_ep_ + learner_redundant_slots_;
    log->expert_sync(plan.ep_rank, local, experts_, actor_ep_, actor_tp_, plan.layers,
                     ranges_size(expert_slices(layout, plan.ep_rank * local, 1, 0)),
                     plan.learner_index == 0, links.node_of(topology_.world_rank()), actor_nodes,
                     plan.slot_of);
  }
  if (plan.learner_index == 0) {
    for (int actor : actors) send(plan.slot_of, actor, kTableTag);
  }
  // Sends go actor by actor and receives learner by learner: a fixed order on both sides, so
  // the blocking point-to-point messages cannot wait on each other in a cycle.
  for (size_t a = 0; a < actors.size(); ++a) {
    const std::vector<ParameterRange> ranges = shared_slices(
        plan, layout, plan.ep_rank, expert_shard_of(int(a) / actor_tp_, actor_ep_, experts_), true);
    if (ranges.empty()) continue;
    send(pack_ranges(params, ranges), actors[a], kTag);
  }
  return bytes;
}

uint64_t ExpertWeightSync::sync(float* params, const ParameterLayout& layout,
                                WeightSync& replicated,
                                const std::vector<std::vector<int>>* learner_slots,
                                ReplicatedSlices* slices) {
  uint64_t bytes = 0;
  const Role role = topology_.role();
  if (replicated.actor_slices() > 1) {
    // Each actor TP rank its slice of the replicated tensors, one broadcast per rank.
    if (role == Role::Actor) {
      const std::vector<ParameterRange> ranges = replicated_ranges(layout);
      std::vector<float> packed(size_t(ranges_size(ranges)));
      const int slice = index_of(topology_.ranks_of(Role::Actor), topology_.world_rank()) %
                        replicated.actor_slices();
      bytes += replicated.broadcast_slice(slice, packed.data(), int64_t(packed.size()));
      unpack_ranges(packed.data(), ranges, params);
    } else if (replicated.member()) {
      if (!slices || int(slices->size()) != replicated.actor_slices()) {
        throw std::logic_error("ExpertWeightSync::sync: learner 0 needs every actor TP slice");
      }
      bytes += replicated.send_slices(*slices);
    }
  } else if (replicated.member()) {
    const std::vector<ParameterRange> ranges = replicated_ranges(layout);
    std::vector<float> packed = role == Role::Learner
                                    ? pack_ranges(params, ranges)
                                    : std::vector<float>(size_t(ranges_size(ranges)));
    bytes += replicated.broadcast(packed.data(), int64_t(packed.size()));
    if (role == Role::Actor) unpack_ranges(packed.data(), ranges, params);
  }
  if (role == Role::Actor) return bytes + receive_routed(params, layout);
  const Plan plan = this->plan(layout, learner_slots);
  return plan.sender ? bytes + send_routed(plan, params, layout, /*posted=*/false) : bytes;
}

uint64_t ExpertWeightSync::post(const float* params, const ParameterLayout& layout,
                                PostedWeightSync& replicated,
                                const std::vector<std::vector<int>>* learner_slots,
                                const PostedWeightSync::Wait& wait,
                                const ReplicatedSlices* slices) {
  const Plan plan = this->plan(layout, learner_slots);
  if (!plan.sender) return 0;
  finish(wait);
  uint64_t bytes = 0;
  if (replicated.member() && slices) {
    bytes += replicated.post_slices(*slices, wait);
  } else if (replicated.member()) {
    const std::vector<float> packed = pack_ranges(params, replicated_ranges(layout));
    bytes += replicated.post(packed.data(), int64_t(packed.size()), wait);
  }
  return bytes + send_routed(plan, params, layout, /*posted=*/true);
}

uint64_t ExpertWeightSync::receive(float* params, const ParameterLayout& layout,
                                   PostedWeightSync& replicated,
                                   const PostedWeightSync::Wait& wait) {
  const std::vector<ParameterRange> ranges = replicated_ranges(layout);
  std::vector<float> packed(size_t(ranges_size(ranges)));
  const uint64_t bytes = replicated.receive(packed.data(), int64_t(packed.size()), wait);
  unpack_ranges(packed.data(), ranges, params);
  return bytes + receive_routed(params, layout);
}

void ExpertWeightSync::finish(const PostedWeightSync::Wait& wait) {
  if (pending_.requests.empty()) return;
  wait(pending_.requests);
  pending_ = {};
}

}  // namespace rlf
