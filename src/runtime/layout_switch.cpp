#include "src/runtime/layout_switch.h"

#include <algorithm>
#include <vector>

#include "src/model/expert_parallel.h"

namespace rlf {

namespace {

constexpr int kTag = 7501;

}  // namespace

ExpertLayoutSwitch::ExpertLayoutSwitch(const HierarchicalComm& ranks, Links& links, int experts,
                                       int train_degree, int generation_degree)
    : links_(links),
      world_ranks_(ranks.world_ranks),
      experts_(experts),
      train_degree_(train_degree),
      generation_degree_(generation_degree) {
  MPI_Comm_dup(ranks.comm, &comm_);
  MPI_Comm_rank(comm_, &rank_);
}

ExpertLayoutSwitch::~ExpertLayoutSwitch() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

ExpertShard ExpertLayoutSwitch::training_shard(int rank) const {
  return expert_shard_of(rank, train_degree_, experts_);
}

ExpertShard ExpertLayoutSwitch::generation_shard(int rank) const {
  return expert_shard_of(rank, generation_degree_, experts_);
}

uint64_t ExpertLayoutSwitch::minimum_bytes(const ParameterLayout& generation_layout) const {
  const ExpertShard wanted = generation_shard(rank_);
  const ExpertShard held = shard_overlap(wanted, training_shard(rank_));
  const int64_t per_expert = ranges_size(expert_slices(generation_layout, wanted.first, 1));
  return uint64_t(per_expert) * uint64_t(wanted.count - std::max(held.count, 0)) * sizeof(float);
}

uint64_t ExpertLayoutSwitch::to_generation(const float* training,
                                           const ParameterLayout& training_layout,
                                           float* generation,
                                           const ParameterLayout& generation_layout) {
  // What this rank already holds: the replicated tensors and the experts in both shards.
  copy_common_parameters(training, training_layout, generation, generation_layout);
  // Peers of the switch: the other ranks of this rank's training replica (every replica holds
  // the same weights, so nothing crosses replicas).
  const int replica_first = rank_ / train_degree_ * train_degree_;
  struct Transfer {
    int peer;
    ExpertShard experts;
    std::vector<float> data;
  };
  std::vector<Transfer> sends, receives;
  for (int peer = replica_first; peer < replica_first + train_degree_; ++peer) {
    if (peer == rank_) continue;
    const ExpertShard mine_to_them = shard_overlap(training_shard(rank_), generation_shard(peer));
    if (mine_to_them.count > 0) {
      sends.push_back({peer, mine_to_them,
                       pack_ranges(training, expert_slices(training_layout, mine_to_them.first,
                                                           mine_to_them.count))});
    }
    const ExpertShard theirs_to_me = shard_overlap(training_shard(peer), generation_shard(rank_));
    if (theirs_to_me.count > 0) {
      const auto ranges = expert_slices(generation_layout, theirs_to_me.first, theirs_to_me.count);
      receives.push_back({peer, theirs_to_me, std::vector<float>(size_t(ranges_size(ranges)))});
    }
  }
  // Every transfer in flight at once: the pairs form no order that blocking calls could follow
  // without risking a cycle.
  std::vector<MPI_Request> requests;
  for (Transfer& r : receives) {
    requests.emplace_back();
    MPI_Irecv(r.data.data(), int(r.data.size()), MPI_FLOAT, r.peer, kTag, comm_, &requests.back());
  }
  for (Transfer& s : sends) {
    links_.count_send(world_ranks_[size_t(s.peer)], s.data.size() * sizeof(float));
    requests.emplace_back();
    MPI_Isend(s.data.data(), int(s.data.size()), MPI_FLOAT, s.peer, kTag, comm_, &requests.back());
  }
  for (MPI_Request& request : requests) wait_with_backoff(&request, MPI_STATUS_IGNORE);
  uint64_t received = 0;
  for (const Transfer& r : receives) {
    const uint64_t bytes = r.data.size() * sizeof(float);
    links_.emulate(world_ranks_[size_t(r.peer)], bytes);
    unpack_ranges(r.data.data(), expert_slices(generation_layout, r.experts.first, r.experts.count),
                  generation);
    received += bytes;
  }
  return received;
}

}  // namespace rlf
