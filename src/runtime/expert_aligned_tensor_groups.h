// Generation TP groups for training with expert parallelism at TP 1 (train --mode fused
// --expert-parallel E --actor-tensor-parallel G, without --tensor-parallel; with or without
// --pipeline-parallel).
//
// Training's EP groups are E consecutive ranks, rank r holding expert block r % E
// (expert_shard_of). TP does not cut the routed experts, so every rank of a generation TP group
// must hold the same expert block, and the EP mates a TP rank dispatches to must be TP ranks of
// the same place in other TP groups. TP groups of consecutive ranks would give a group E different
// blocks (every expert would have to move before each generation phase). Here a TP group is the G
// ranks holding one block in a run of G x E consecutive ranks (a stride of E): TP rank t of the
// group with block e in run b is rank b G E + t E + e. Then each training EP group is TP place t
// of E consecutive TP groups, the layout TP x EP generation runs over
// (src/runtime/tensor_expert_parallel.h), and generation uses training's EP groups with the
// experts (after migrations, the placement in force, spare replica slots included) where training
// keeps them: nothing moves but the dense slices, which each rank cuts from its own whole dense
// model (with pipelines, the same groups in the stage-major order, where a stage's EP groups are
// consecutive; each stage then receives its slice of the other stages' layers).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "mpi_comm/links.h"
#include "src/model/model_config.h"
#include "src/model/tensor_parallel.h"

namespace rlf {

// Why TP groups of `degree` beside EP groups of `expert_parallel` do not fit `ranks` (empty when
// they do): the runs of degree x expert_parallel ranks must tile the ranks.
std::string expert_aligned_tensor_problem(int ranks, int degree, int expert_parallel);

// The position of `rank` in the order in which the groups above are consecutive runs of `degree`
// ranks (a permutation of [0, ranks) when expert_aligned_tensor_problem finds none).
int expert_aligned_tensor_position(int rank, int degree, int expert_parallel);

// The TP groups above over `comm` (training's EP groups being `expert_parallel` consecutive ranks
// of it): TP rank t of group b E + e is the rank with position (b E + e) G + t. Collective over
// `comm`. Throws ConfigError when the groups do not fit (expert_aligned_tensor_problem) or the
// degree does not fit the model (validate_tensor_parallel).
std::unique_ptr<TensorParallel> make_expert_aligned_tensor_parallel(MPI_Comm comm, int degree,
                                                                    int expert_parallel,
                                                                    bool attention_only,
                                                                    const ModelConfig& config,
                                                                    Links& links);

}  // namespace rlf
