// RL Fusion's layout switch between the training and the generation expert layout of the same
// ranks (fused mode). Every rank belongs to a training EP group of `train_degree` consecutive
// ranks and a generation EP group of `generation_degree` consecutive ranks. Switching fills a
// buffer holding this rank's generation shard: the replicated tensors from its own training
// buffer, the experts it already owns copied locally, and every other expert of its generation
// shard from the rank that owns it in its own training replica, one message per (owner,
// receiver) pair. No rank receives an expert it will not store, and no rank assembles a whole
// tensor it does not own in the generation layout. Generation does not change weights, so the
// switch back to training is free: the generation buffer is simply dropped.
#pragma once

#include <cstdint>

#include "mpi_comm/topology.h"
#include "src/model/parameter_layout.h"

namespace rlf {

class ExpertLayoutSwitch {
 public:
  // Collective over ranks.comm (the ranks that train and generate, in order). The degrees must
  // divide the rank count and the experts (validate_role_expert_parallel).
  ExpertLayoutSwitch(const HierarchicalComm& ranks, Links& links, int experts, int train_degree,
                     int generation_degree);
  ~ExpertLayoutSwitch();
  ExpertLayoutSwitch(const ExpertLayoutSwitch&) = delete;
  ExpertLayoutSwitch& operator=(const ExpertLayoutSwitch&) = delete;

  ExpertShard training_shard(int rank) const;
  ExpertShard generation_shard(int rank) const;

  // Collective. Fills `generation` (laid out by generation_layout, this rank's generation shard)
  // from `training` (training_layout, this rank's training shard). Returns the bytes this rank
  // received from other ranks.
  uint64_t to_generation(const float* training, const ParameterLayout& training_layout,
                         float* generation, const ParameterLayout& generation_layout);
  // The least any switch must move to this rank: the bytes of the experts of its generation
  // shard that its training shard does not hold.
  uint64_t minimum_bytes(const ParameterLayout& generation_layout) const;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  Links& links_;
  std::vector<int> world_ranks_;
  int rank_ = 0, experts_, train_degree_, generation_degree_;
};

}  // namespace rlf
