#include "src/runtime/layout_switch.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "mpi_comm/expert_dispatch.h"
#include "src/model/expert_parallel.h"
#include "src/runtime/expert_replicas.h"
#include "src/runtime/memory_blocks.h"

namespace rlf {

namespace {

constexpr int kTag = 7501;

}  // namespace

ExpertLayoutSwitch::ExpertLayoutSwitch(const HierarchicalComm& ranks, Links& links,
                                       const ModelConfig& config, int train_degree,
                                       int generation_degree, int redundant_slots)
    : links_(links),
      world_ranks_(ranks.world_ranks),
      layers_(config.n_layers),
      experts_(config.n_experts),
      d_ff_(config.d_ff),
      d_model_(config.d_model),
      bucket_bytes_(size_t(expert_bucket_elements(config)) * sizeof(float)),
      train_degree_(train_degree),
      generation_degree_(generation_degree),
      local_slots_(config.n_experts / train_degree + redundant_slots),
      redundant_(redundant_slots) {
  MPI_Comm_dup(ranks.comm, &comm_);
  MPI_Comm_rank(comm_, &rank_);
}

ExpertLayoutSwitch::~ExpertLayoutSwitch() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

ExpertShard ExpertLayoutSwitch::training_shard(int rank) const {
  ExpertShard shard = expert_shard_of(rank, train_degree_, experts_);
  shard.redundant = redundant_;
  return shard;
}

ExpertShard ExpertLayoutSwitch::generation_shard(int rank) const {
  return expert_shard_of(rank, generation_degree_, experts_);
}

void ExpertLayoutSwitch::follow_slot_experts(const std::vector<std::vector<int>>* slot_expert) {
  slot_expert_ = slot_expert;
}

void ExpertLayoutSwitch::follow_generation_slots(const std::vector<std::vector<int>>* slot_expert) {
  generation_slot_expert_ = slot_expert;
}

int ExpertLayoutSwitch::generation_expert(int layer, int slot) const {
  if (!generation_slot_expert_ || generation_slot_expert_->empty()) return slot;
  return (*generation_slot_expert_)[size_t(layer)][size_t(slot)];
}

std::vector<std::vector<int>> ExpertLayoutSwitch::training_tables() const {
  if (slot_expert_ && !slot_expert_->empty()) return *slot_expert_;
  return std::vector<std::vector<int>>(size_t(layers_),
                                       default_slot_experts(experts_, train_degree_, redundant_));
}

ExpertLayoutSwitch::Replicas ExpertLayoutSwitch::replicas() const {
  if (slot_expert_ && !slot_expert_->empty()) return replica_slots(*slot_expert_, experts_);
  return replica_slots(training_tables(), experts_);  // the default fill
}

ExpertLayoutSwitch::Holder ExpertLayoutSwitch::holder(const Replicas& replicas, int layer,
                                                      int expert, int receiver) const {
  const std::vector<int>& slots = replicas[size_t(layer)][size_t(expert)];
  // Replicas are bit-identical: a copy the receiver holds costs nothing, else the first one.
  const auto own = std::find_if(slots.begin(), slots.end(),
                                [&](int slot) { return slot / local_slots_ == receiver; });
  const int slot = own != slots.end() ? *own : slots.front();
  return {slot / local_slots_, slot % local_slots_};
}

int ExpertLayoutSwitch::buckets_to_receive() const {
  const ExpertShard wanted = generation_shard(rank_);
  const Replicas placed = replicas();
  const int ep_rank = rank_ % train_degree_;
  int missing = 0;
  for (int l = 0; l < layers_; ++l)
    for (int s = wanted.first; s < wanted.first + wanted.count; ++s)
      missing += holder(placed, l, generation_expert(l, s), ep_rank).ep_rank != ep_rank;
  return missing;
}

uint64_t ExpertLayoutSwitch::minimum_bytes() const {
  return uint64_t(buckets_to_receive()) * bucket_bytes();
}

GenerationExperts ExpertLayoutSwitch::to_generation(float* training,
                                                    const ParameterLayout& training_layout,
                                                    SlotPool& pool) {
  return to_generation(ExpertTable<float>(training_layout, training), pool);
}

GenerationExperts ExpertLayoutSwitch::to_generation(const ExpertTable<float>& held,
                                                    SlotPool& pool) {
  const ExpertShard wanted = generation_shard(rank_);
  const int ep_rank = rank_ % train_degree_;
  if (held.layers() != layers_ || !held.complete() ||
      held.shard().first != ep_rank * local_slots_ || held.shard().count != local_slots_) {
    throw std::invalid_argument(
        "ExpertLayoutSwitch: the training experts must be exactly this rank's training slots on "
        "every layer");
  }
  if (pool.free_slots() < buckets_to_receive() || pool.slot_bytes() < bucket_bytes()) {
    throw std::invalid_argument(
        "ExpertLayoutSwitch: the pool has " + std::to_string(pool.free_slots()) +
        " free slots of " + std::to_string(pool.slot_bytes()) + " bytes, the switch needs " +
        std::to_string(buckets_to_receive()) + " of " + std::to_string(bucket_bytes()));
  }
  // `held`: the training slots this rank stores, by index; which expert each holds is the
  // placement's.
  const int64_t FC = int64_t(d_ff_) * d_model_;
  const Replicas placed = replicas();
  const int replica_first = rank_ - ep_rank;
  if (RoutingLog* log = links_.routing_log()) {
    // The switch's inputs, for plan --validate: the placements on both sides.
    std::vector<int> links_node;
    for (int peer = replica_first; peer < replica_first + train_degree_; ++peer)
      links_node.push_back(links_.node_of(world_ranks_[size_t(peer)]));
    std::vector<std::vector<int>> generation(static_cast<size_t>(layers_));
    for (int l = 0; l < layers_; ++l)
      for (int s = wanted.first; s < wanted.first + wanted.count; ++s)
        generation[size_t(l)].push_back(generation_expert(l, s));
    log->expert_switch(ep_rank, local_slots_, experts_, 3 * FC, links_node, training_tables(),
                       generation);
  }
  GenerationExperts out{ExpertTable<float>(layers_, wanted), {}, 0};
  // What this rank already holds, in place (the table's entry s: the expert of generation slot s).
  for (int l = 0; l < layers_; ++l) {
    for (int s = wanted.first; s < wanted.first + wanted.count; ++s) {
      const Holder h = holder(placed, l, generation_expert(l, s), ep_rank);
      if (h.ep_rank == ep_rank) {
        out.table.set(l, s, held.w1(l)[h.slot], held.w3(l)[h.slot], held.w2(l)[h.slot]);
      }
    }
  }
  // Peers of the switch: the other ranks of this rank's training replica (every replica holds
  // the same weights in the same placement, so nothing crosses replicas). Each pair exchanges one
  // message each way, its buckets in (layer, generation slot) order on both sides.
  struct Transfer {
    int peer;
    MemoryBlocks blocks;
    MPI_Datatype type = MPI_DATATYPE_NULL;
  };
  std::vector<Transfer> sends, receives;
  for (int peer = replica_first; peer < replica_first + train_degree_; ++peer) {
    if (peer == rank_) continue;
    Transfer send{peer, {}}, receive{peer, {}};
    const ExpertShard theirs = generation_shard(peer);
    for (int l = 0; l < layers_; ++l) {
      for (int s = theirs.first; s < theirs.first + theirs.count; ++s) {
        const Holder h = holder(placed, l, generation_expert(l, s), peer - replica_first);
        if (h.ep_rank != ep_rank) continue;
        send.blocks.add(held.w1(l)[h.slot], FC);
        send.blocks.add(held.w3(l)[h.slot], FC);
        send.blocks.add(held.w2(l)[h.slot], FC);
      }
      for (int s = wanted.first; s < wanted.first + wanted.count; ++s) {
        if (holder(placed, l, generation_expert(l, s), ep_rank).ep_rank != peer - replica_first)
          continue;
        float* bucket = pool.acquire_as<float>();
        out.received.push_back(bucket);
        out.table.set_bucket(l, s, bucket, d_ff_, d_model_);
        receive.blocks.add(bucket, 3 * FC);
      }
    }
    if (send.blocks.floats > 0) sends.push_back(std::move(send));
    if (receive.blocks.floats > 0) receives.push_back(std::move(receive));
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
