// RL Fusion's layout switch between the training and the generation expert layout of the same
// ranks (fused mode). Every rank belongs to a training EP group of `train_degree` consecutive
// ranks and a generation EP group of `generation_degree` consecutive ranks.
//
// Parameter buckets: the switch copies nothing the rank already holds. Its generation view
// (Transformer's view constructor) reads the replicated tensors and every expert both shards hold
// where training keeps them; each expert of the generation shard that the training shard lacks is
// one bucket (w1 | w3 | w2) received by MPI straight into a free slot of a SlotPool, which its
// owner (the rank holding it in this rank's training replica) sends straight from its parameters
// (a derived datatype over the three matrices: no pack, no staging). One message per (owner,
// receiver) pair carries all of its buckets. No rank receives an expert it will not run, and no
// rank assembles a whole tensor it does not own in the generation layout. Generation does not
// change weights, so the switch back to training only gives the slots back.
//
// Generation addresses experts by id (generation EP rank g runs experts [g E / G, (g + 1) E / G)
// with its dispatchers' identity tables, or, with a generation placement of its own
// (follow_generation_slots, EDPB), the experts of its slots [g E / G, (g + 1) E / G) in that
// placement's tables, layer by layer); training keeps them where its placement says, which
// after expert migration (EDPB, follow_slot_experts) is no longer slot = id: the switch finds each
// wanted expert's holder through that placement, layer by layer. With redundant training slots
// (replicas of hot experts, bit-identical copies) it takes one copy of each expert: the
// receiver's own when its training EP rank holds one, else the first replica (lowest slot).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/slot_pool.h"
#include "mpi_comm/topology.h"
#include "src/model/expert_table.h"
#include "src/model/model_config.h"
#include "src/model/parameter_layout.h"

namespace rlf {

// A rank's generation experts: every expert of its generation shard on every layer, in place or
// in a slot of the pool they came with.
struct GenerationExperts {
  ExpertTable<float> table;
  std::vector<float*> received;  // the slots holding experts received from other ranks
  uint64_t received_bytes = 0;   // bytes received from other ranks
};

class ExpertLayoutSwitch {
 public:
  // Collective over ranks.comm (the ranks that train and generate, in order). The degrees must
  // divide the rank count and the experts (validate_role_expert_parallel); every training EP
  // rank holds E / train_degree + `redundant_slots` expert slots (validate_redundant_slots).
  ExpertLayoutSwitch(const HierarchicalComm& ranks, Links& links, const ModelConfig& config,
                     int train_degree, int generation_degree, int redundant_slots = 0);
  ~ExpertLayoutSwitch();
  ExpertLayoutSwitch(const ExpertLayoutSwitch&) = delete;
  ExpertLayoutSwitch& operator=(const ExpertLayoutSwitch&) = delete;

  // The training slots `rank` stores (a slot-space shard with redundant slots).
  ExpertShard training_shard(int rank) const;
  ExpertShard generation_shard(int rank) const;

  // The training placement the switch reads experts through after expert migration: [layer]
  // [slot] -> expert of the training EP group (slot s on EP rank s / (E / train_degree + R), as
  // RoleExpertParallel::slot_experts()), read at every call, so migrations between switches are
  // followed. Null or empty (the default): default_slot_experts. Must outlive the switch.
  void follow_slot_experts(const std::vector<std::vector<int>>* slot_expert);
  // The generation placement: [layer][slot] -> expert of the generation EP group (slot s on
  // generation EP rank s / (E / generation_degree), no replicas; the tables the generation
  // dispatchers route by), read at every call. Null or empty (the default): expert = slot. The
  // generation view's table is then indexed by slot: entry s holds the expert of slot s.
  // Must outlive the switch.
  void follow_generation_slots(const std::vector<std::vector<int>>* slot_expert);

  // The slots this rank's switch fills: one per layer and expert of its generation shard that its
  // training EP rank holds no copy of (under the placement in force); and the size of one (a
  // bucket of expert_bucket_elements).
  int buckets_to_receive() const;
  size_t bucket_bytes() const { return bucket_bytes_; }
  // The least any switch must move to this rank: those buckets' bytes.
  uint64_t minimum_bytes() const;

  // Collective. This rank's generation experts by expert id over `training` (the flat parameters
  // laid out by `training_layout`, which must store exactly this rank's training slots): held
  // experts in place, the others received into slots of `pool` (buckets_to_receive() of them
  // must be free).
  GenerationExperts to_generation(float* training, const ParameterLayout& training_layout,
                                  SlotPool& pool);
  // The same over the training slots `held` addresses (every layer's, slot by slot: a model's
  // experts(), also a stitched view's, whose layers lie in two buffers, so that a pipeline stage
  // switches without a whole-model copy of its own layers). Its shard must be exactly this rank's
  // training slots.
  GenerationExperts to_generation(const ExpertTable<float>& held, SlotPool& pool);
  // After the generation phase: the received slots go back to `pool`.
  void to_training(GenerationExperts& generation, SlotPool& pool) const;

 private:
  // The copy of expert `expert` of `layer` that training EP rank `receiver` takes: its EP rank in
  // the training group, and the index of the slot among that rank's slots. `replicas` is
  // replica_slots() of the placement in force.
  struct Holder {
    int ep_rank, slot;
  };
  using Replicas = std::vector<std::vector<std::vector<int>>>;
  Replicas replicas() const;
  // The training placement: every layer's slot table (the followed one, or the default fill).
  std::vector<std::vector<int>> training_tables() const;
  Holder holder(const Replicas& replicas, int layer, int expert, int receiver) const;
  // The expert in generation slot `slot` of `layer` under the generation placement in force.
  int generation_expert(int layer, int slot) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  const std::vector<std::vector<int>>* slot_expert_ = nullptr;
  const std::vector<std::vector<int>>* generation_slot_expert_ = nullptr;
  Links& links_;
  std::vector<int> world_ranks_;
  int rank_ = 0, layers_, experts_, d_ff_, d_model_;
  size_t bucket_bytes_;
  int train_degree_, generation_degree_, local_slots_, redundant_;
};

}  // namespace rlf
