#include "src/runtime/layout_switch.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "src/model/expert_parallel.h"

namespace rlf {

namespace {

constexpr int kTag = 7501;

// Pieces of memory one message carries, in order: (first float, floats).
struct Blocks {
  std::vector<MPI_Aint> addresses;
  std::vector<int> lengths;
  uint64_t floats = 0;

  void add(const float* data, int64_t count) {
    MPI_Aint address;
    MPI_Get_address(data, &address);
    floats += uint64_t(count);
    // A piece that continues the previous one extends it (consecutive slots, w1 | w3 | w2).
    if (!lengths.empty() &&
        addresses.back() + MPI_Aint(lengths.back()) * MPI_Aint(sizeof(float)) == address &&
        int64_t(lengths.back()) + count <= INT_MAX) {
      lengths.back() += int(count);
      return;
    }
    addresses.push_back(address);
    lengths.push_back(int(count));
  }
  // A datatype over the pieces at their absolute addresses (used from MPI_BOTTOM).
  MPI_Datatype type() const {
    MPI_Datatype t;
    MPI_Type_create_hindexed(int(lengths.size()), lengths.data(), addresses.data(), MPI_FLOAT, &t);
    MPI_Type_commit(&t);
    return t;
  }
};

}  // namespace

ExpertLayoutSwitch::ExpertLayoutSwitch(const HierarchicalComm& ranks, Links& links,
                                       const ModelConfig& config, int train_degree,
                                       int generation_degree)
    : links_(links),
      world_ranks_(ranks.world_ranks),
      layers_(config.n_layers),
      experts_(config.n_experts),
      d_ff_(config.d_ff),
      d_model_(config.d_model),
      bucket_bytes_(size_t(expert_bucket_elements(config)) * sizeof(float)),
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

int ExpertLayoutSwitch::buckets_to_receive() const {
  return expert_buckets_missing(training_shard(rank_), generation_shard(rank_), layers_);
}

uint64_t ExpertLayoutSwitch::minimum_bytes() const {
  return uint64_t(buckets_to_receive()) * bucket_bytes();
}

GenerationExperts ExpertLayoutSwitch::to_generation(float* training,
                                                    const ParameterLayout& training_layout,
                                                    SlotPool& pool) {
  const ExpertShard own = training_shard(rank_), wanted = generation_shard(rank_);
  if (training_layout.first_expert() != own.first ||
      training_layout.stored_experts() != own.count) {
    throw std::invalid_argument(
        "ExpertLayoutSwitch: the training layout must store exactly this rank's training experts");
  }
  if (pool.free_slots() < buckets_to_receive() || pool.slot_bytes() < bucket_bytes()) {
    throw std::invalid_argument(
        "ExpertLayoutSwitch: the pool has " + std::to_string(pool.free_slots()) +
        " free slots of " + std::to_string(pool.slot_bytes()) + " bytes, the switch needs " +
        std::to_string(buckets_to_receive()) + " of " + std::to_string(bucket_bytes()));
  }
  const ExpertTable<float> held(training_layout, training);
  const int64_t FC = int64_t(d_ff_) * d_model_;
  GenerationExperts out{ExpertTable<float>(layers_, wanted), {}, 0};
  // What this rank already holds, in place: the experts in both shards.
  const ExpertShard both = shard_overlap(wanted, own);
  for (int l = 0; l < layers_; ++l) {
    for (int e = both.first; e < both.first + both.count; ++e) {
      const size_t s = size_t(e - own.first);
      out.table.set(l, e, held.w1(l)[s], held.w3(l)[s], held.w2(l)[s]);
    }
  }
  // Peers of the switch: the other ranks of this rank's training replica (every replica holds
  // the same weights, so nothing crosses replicas). Each pair exchanges one message each way.
  const int replica_first = rank_ / train_degree_ * train_degree_;
  struct Transfer {
    int peer;
    Blocks blocks;
    MPI_Datatype type = MPI_DATATYPE_NULL;
  };
  std::vector<Transfer> sends, receives;
  for (int peer = replica_first; peer < replica_first + train_degree_; ++peer) {
    if (peer == rank_) continue;
    const ExpertShard mine_to_them = shard_overlap(own, generation_shard(peer));
    if (mine_to_them.count > 0) {
      Transfer send{peer, {}};
      for (int l = 0; l < layers_; ++l) {
        for (int e = mine_to_them.first; e < mine_to_them.first + mine_to_them.count; ++e) {
          const size_t s = size_t(e - own.first);
          send.blocks.add(held.w1(l)[s], FC);
          send.blocks.add(held.w3(l)[s], FC);
          send.blocks.add(held.w2(l)[s], FC);
        }
      }
      sends.push_back(std::move(send));
    }
    const ExpertShard theirs_to_me = shard_overlap(training_shard(peer), wanted);
    if (theirs_to_me.count > 0) {
      Transfer receive{peer, {}};
      for (int l = 0; l < layers_; ++l) {
        for (int e = theirs_to_me.first; e < theirs_to_me.first + theirs_to_me.count; ++e) {
          float* slot = pool.acquire_as<float>();
          out.received.push_back(slot);
          out.table.set_bucket(l, e, slot, d_ff_, d_model_);
          receive.blocks.add(slot, 3 * FC);
        }
      }
      receives.push_back(std::move(receive));
    }
  }
  // Every transfer in flight at once: the pairs form no order that blocking calls could follow
  // without risking a cycle.
  std::vector<MPI_Request> requests;
  for (Transfer& r : receives) {
    r.type = r.blocks.type();
    requests.emplace_back();
    MPI_Irecv(MPI_BOTTOM, 1, r.type, r.peer, kTag, comm_, &requests.back());
  }
  for (Transfer& s : sends) {
    s.type = s.blocks.type();
    links_.count_send(world_ranks_[size_t(s.peer)], s.blocks.floats * sizeof(float));
    requests.emplace_back();
    MPI_Isend(MPI_BOTTOM, 1, s.type, s.peer, kTag, comm_, &requests.back());
  }
  for (MPI_Request& request : requests) wait_with_backoff(&request, MPI_STATUS_IGNORE);
  for (Transfer& t : sends) MPI_Type_free(&t.type);
  for (Transfer& r : receives) {
    MPI_Type_free(&r.type);
    const uint64_t bytes = r.blocks.floats * sizeof(float);
    links_.emulate(world_ranks_[size_t(r.peer)], bytes);
    out.received_bytes += bytes;
  }
  return out;
}

void ExpertLayoutSwitch::to_training(GenerationExperts& generation, SlotPool& pool) const {
  for (float* slot : generation.received) pool.give_back(slot);
  generation.received.clear();
}

}  // namespace rlf
